package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
	"github.com/etcdsync/etcdsync/internal/testkit/primtest"
)

// A transfer under faults: the leader's handover Txn answered late or never, the chosen
// candidate's acceptance never sent, its lease revoked between the two. In every case at
// most one of the leader and the candidate believes it leads, the election moves on, and
// nothing is left behind.

// transferSetup is a leader whose client has inj, a first candidate "c1" and the chosen
// one "x" on clients of their own (x's with xinj), waiting behind it.
type transferSetup struct {
	leader, c1, x *election.Election
	c1won, xwon   <-chan error
	token         int64
	admin         *clientv3.Client
}

func setUpTransfer(t *testing.T, name string, inj, xinj *etcdtest.Injector) transferSetup {
	ctx := etcdtest.Context(t)
	s := transferSetup{admin: cluster.Client(t)}
	s.leader = newElection(t, inj.Client(t, cluster), name)
	require.NoError(t, s.leader.Campaign(ctx, "leader"))
	s.token = s.leader.Token()
	s.c1 = newElection(t, cluster.Client(t), name)
	s.c1won = campaignAsync(ctx, s.c1, "c1")
	primtest.AwaitKeys(t, s.admin, name, 2)
	s.x = newElection(t, xinj.Client(t, cluster), name)
	s.xwon = campaignAsync(ctx, s.x, "x")
	primtest.AwaitKeys(t, s.admin, name, 3)
	return s
}

// finish resigns x if it leads, then c1 (whose Campaign has returned if c1led), and checks
// that nothing is left.
func (s transferSetup) finish(t *testing.T, name string, c1led bool) {
	ctx := etcdtest.Context(t)
	if s.x.Err() == nil {
		require.NoError(t, s.x.Resign(ctx))
	}
	if !c1led {
		require.NoError(t, etcdtest.Within(t, s.c1won, 20*time.Second, "c1's Campaign"))
	}
	require.NoError(t, s.c1.Resign(ctx))
	primtest.AwaitKeys(t, s.admin, name, 0)
	etcdtest.AwaitKeys(t, s.admin, core.HandoverRecordKey(core.NamePrefix(name), ""), 0)
}

func TestTransferWhoseHandoverIsAnsweredLate(t *testing.T) {
	const name = "transfer-late"
	ctx := etcdtest.Context(t)
	inj := &etcdtest.Injector{}
	s := setUpTransfer(t, name, inj, &etcdtest.Injector{})
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Late, Delay: 300 * time.Millisecond, Times: 1})
	require.NoError(t, s.leader.Transfer(ctx, "x"))
	assert.ErrorIs(t, s.leader.Err(), election.ErrNotLeader)
	require.NoError(t, etcdtest.Within(t, s.xwon, 10*time.Second, "x's Campaign"))
	assert.Equal(t, s.token, s.x.Token())
	inj.Settle()
	require.NoError(t, s.x.Err())
	etcdtest.Pending(t, s.c1won, "c1, passed over")
	s.finish(t, name, false)
}

func TestTransferWhoseHandoverGetsNoAnswer(t *testing.T) {
	const name = "transfer-dropped"
	ctx := etcdtest.Context(t)
	inj := &etcdtest.Injector{}
	s := setUpTransfer(t, name, inj, &etcdtest.Injector{})
	inj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnPutsUnder(core.NamePrefix(name)), Action: etcdtest.Drop, Times: 1})
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	assert.Error(t, s.leader.Transfer(tctx, "x"))
	assert.ErrorIs(t, s.leader.Err(), election.ErrLost, "a leader unsure of its handover leads no more")
	// The handover was applied: the candidate takes over.
	require.NoError(t, etcdtest.Within(t, s.xwon, 10*time.Second, "x's Campaign"))
	assert.Equal(t, s.token, s.x.Token())
	etcdtest.Pending(t, s.c1won, "c1, passed over")
	s.finish(t, name, false)
}

func TestTransferWhoseAcceptanceIsNeverSent(t *testing.T) {
	const name = "transfer-unaccepted"
	ctx := etcdtest.Context(t)
	xinj := &etcdtest.Injector{}
	s := setUpTransfer(t, name, &etcdtest.Injector{}, xinj)
	xinj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.HandoverRecordKey(core.NamePrefix(name), "")), Action: etcdtest.Lose, Times: 1})
	err := s.leader.Transfer(ctx, "x")
	assert.ErrorIs(t, err, election.ErrNoCandidate)
	assert.Error(t, s.leader.Err(), "the leader's key went: it leads no more")
	assert.ErrorIs(t, etcdtest.Within(t, s.xwon, 10*time.Second, "x's Campaign"), election.ErrLost,
		"a candidate unsure whether it accepted drops the key and does not lead")
	require.NoError(t, etcdtest.Within(t, s.c1won, 10*time.Second, "c1 leads next"))
	assert.Greater(t, s.c1.Token(), s.token)
	s.finish(t, name, true)
}

func TestTransferWhoseCandidatesLeaseIsRevokedBeforeItAccepts(t *testing.T) {
	const name = "transfer-revoked"
	ctx := etcdtest.Context(t)
	xinj := &etcdtest.Injector{}
	s := setUpTransfer(t, name, &etcdtest.Injector{}, xinj)
	release, accepting := make(chan struct{}), make(chan struct{}, 1)
	xinj.Add(etcdtest.Rule{Method: "Txn", Match: etcdtest.TxnDeletesUnder(core.HandoverRecordKey(core.NamePrefix(name), "")), Action: etcdtest.Hold, Until: release, Times: 1,
		Matched: func() { accepting <- struct{}{} }})
	transferred := etcdtest.Async(func() error { return s.leader.Transfer(ctx, "x") })
	etcdtest.Within(t, accepting, 10*time.Second, "x's acceptance")
	_, err := s.admin.Revoke(ctx, leaderLease(t, s.admin, name)) // the key is on x's lease now
	require.NoError(t, err)
	require.NoError(t, etcdtest.Within(t, s.c1won, 10*time.Second, "c1 leads once x's lease is gone"))
	close(release)
	assert.ErrorIs(t, etcdtest.Within(t, transferred, 10*time.Second, "Transfer"), election.ErrNoCandidate)
	assert.Error(t, s.leader.Err())
	assert.ErrorIs(t, etcdtest.Within(t, s.xwon, 10*time.Second, "x's Campaign"), election.ErrLost)
	s.finish(t, name, true)
}
