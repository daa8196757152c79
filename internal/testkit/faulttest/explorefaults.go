package faulttest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/internal/core"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// exploreFault is one kind of fault the explorer draws. apply disturbs and, unless the
// disturbance is a rule that wears off by itself (injected RPC faults apply to a few calls),
// heals before it returns.
type exploreFault struct {
	name   string
	weight int
	apply  func(ctx context.Context, x *exploration) (detail string, err error)
	env    faultEnv // the Envs it is drawn on
}

// faultEnv says on which Envs an exploreFault is drawn.
type faultEnv int

const (
	anyEnv   faultEnv = iota
	plainEnv          // it stops members: never on an Env with auth (see NewAuthEnv)
	authEnv           // it changes the auth store: only on an Env with auth
)

// drawnOn reports whether f is drawn on env.
func (f exploreFault) drawnOn(env *Env) bool {
	switch f.env {
	case plainEnv:
		return !env.auth
	case authEnv:
		return env.auth
	}
	return true
}

// exploreFaults are the faults the explorer draws from, with their weights.
var exploreFaults = []exploreFault{
	{"lease revoked", 3, revokeALease, anyEnv},
	{"keys deleted", 2, deleteTheKeys, anyEnv},
	{"client cut off", 3, cutOffAClient, anyEnv},
	{"late deletes", 2, injectOn("Txn", matchDeletes, etcdtest.Late, 2), anyEnv},
	{"late writes", 2, injectOn("Txn", matchPuts, etcdtest.Late, 1), anyEnv},
	{"lost requests", 2, injectOn("Txn", matchBoth, etcdtest.Lose, 1), anyEnv},
	{"dropped answers", 1, injectOn("Txn", matchPuts, etcdtest.Drop, 1), anyEnv},
	{"delayed answers", 2, injectOn("Txn", matchBoth, etcdtest.Delay, 3), anyEnv},
	{"silent renewals", 2, injectOn("LeaseKeepAlive", matchStream, etcdtest.Lose, 2), anyEnv},
	{"shutdown", 1, shutDownAClient, anyEnv},
	{"compaction", 1, compactNow, anyEnv},
	{"compaction, then a member restarted", 1, compactThenRestart, plainEnv},
	{"auth store changed", 3, changeTheAuthStore, authEnv},
	{"member partitioned", 1, partitionAMember, anyEnv},
	{"leader stopped", 1, stopTheLeader, plainEnv},
	{"majority down", 1, stopAMajority, plainEnv},
}

func (x *exploration) drawFault() exploreFault {
	faults := exploreFaults
	if x.r.w.Disturb != nil {
		faults = append(faults[:len(faults):len(faults)], exploreFault{"the primitive's own", 2, func(ctx context.Context, x *exploration) (string, error) {
			return x.r.w.Disturb(ctx, x.r.env.Admin, x.r.name, x.rng)
		}, anyEnv})
	}
	return x.drawFrom(faults)
}

// drawFrom draws one of faults, by weight, among those drawn on the run's Env.
func (x *exploration) drawFrom(faults []exploreFault) exploreFault {
	total := 0
	for _, f := range faults {
		if f.drawnOn(x.r.env) {
			total += f.weight
		}
	}
	n := x.rng.IntN(total)
	for _, f := range faults {
		if !f.drawnOn(x.r.env) {
			continue
		}
		if n < f.weight {
			return f
		}
		n -= f.weight
	}
	panic("unreachable")
}

// client draws a client, and says which.
func (x *exploration) client() (*Client, string) {
	i := x.rng.IntN(len(x.clients))
	return x.clients[i], fmt.Sprintf("client %d", i)
}

// revokeALease revokes the lease of a key of the name drawn at random: every hold and
// waiter of that client on it ends at once, at one revision.
func revokeALease(ctx context.Context, x *exploration) (string, error) {
	resp, err := x.r.env.Admin.Get(ctx, x.r.w.Prefix(x.r.name), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) == 0 {
		return "no key", err
	}
	kv := resp.Kvs[x.rng.IntN(len(resp.Kvs))]
	lease := clientv3.LeaseID(kv.Lease)
	if _, err := x.r.env.Admin.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return "", fmt.Errorf("revoke %x: %w", int64(lease), err)
	}
	return fmt.Sprintf("lease %x of %s (token %d)", int64(lease), kv.Key, kv.CreateRevision), nil
}

// deleteTheKeys deletes every key of the name at one revision, as `etcdctl del --prefix`.
func deleteTheKeys(ctx context.Context, x *exploration) (string, error) {
	resp, err := x.r.env.Admin.Delete(ctx, x.r.w.Prefix(x.r.name), clientv3.WithPrefix())
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d keys at revision %d", resp.Deleted, resp.Header.Revision), nil
}

// cutOffAClient cuts a client drawn at random off for a while, from a moment to past its
// lease's TTL, and checks meanwhile that every other client's own lock makes progress.
func cutOffAClient(ctx context.Context, x *exploration) (string, error) {
	i := x.rng.IntN(len(x.clients))
	d := time.Duration(300+x.rng.IntN(int(x.r.w.TTL/time.Millisecond)+2000)) * time.Millisecond
	detail := fmt.Sprintf("client %d for %v", i, d)
	// Every client's own lock goes on first: one still recovering from an earlier fault is
	// not yet the healthy client this fault is about.
	for j, s := range x.side {
		select {
		case <-s.next():
		case <-time.After(sideRecovery):
			return detail, fmt.Errorf("client %d's own lock made no progress in %v before the cut%s", j, sideRecovery, dumpGoroutines(x.t.ArtifactDir()))
		case <-ctx.Done():
			return detail, ctx.Err()
		}
	}
	// Paused, not black-holed: what a cut holds back arrives late, and no connection is left
	// garbled (see etcdtest.Proxy.Pause).
	cut := x.clients[i]
	cut.Pause()
	defer cut.Resume()
	until := time.NewTimer(d)
	defer until.Stop()
	for j, s := range x.side {
		if j == i {
			continue
		}
		select {
		case <-s.next():
		case <-time.After(sideProgress):
			return detail, fmt.Errorf("client %d's own lock made no progress in %v while client %d was cut off", j, sideProgress, i)
		case <-ctx.Done():
			return detail, ctx.Err()
		}
	}
	select {
	case <-until.C:
	case <-ctx.Done():
	}
	return detail, nil
}

// ruleMatch is what an injected rule matches.
type ruleMatch int

const (
	matchStream  ruleMatch = iota // every stream of the method
	matchDeletes                  // the Txns that delete a key of the name
	matchPuts                     // the Txns that put a key of the name
	matchBoth                     // either
)

// injectOn returns a fault that adds a rule for a few calls of method on a client drawn at
// random, those that what matches.
func injectOn(method string, what ruleMatch, action etcdtest.Action, times int) func(context.Context, *exploration) (string, error) {
	return func(_ context.Context, x *exploration) (string, error) {
		rule := etcdtest.Rule{Method: method, Action: action, Times: 1 + x.rng.IntN(times)}
		prefix := x.r.w.Prefix(x.r.name)
		switch what {
		case matchDeletes:
			rule.Match = etcdtest.TxnDeletesUnder(prefix)
		case matchPuts:
			rule.Match = etcdtest.TxnPutsUnder(prefix)
		case matchBoth:
			del, put := etcdtest.TxnDeletesUnder(prefix), etcdtest.TxnPutsUnder(prefix)
			rule.Match = func(req any) bool { return del(req) || put(req) }
		}
		switch action {
		case etcdtest.Late:
			rule.Delay = time.Duration(x.rng.IntN(2000)) * time.Millisecond
		case etcdtest.Delay:
			rule.Delay = time.Duration(50+x.rng.IntN(500)) * time.Millisecond
		}
		c, which := x.client()
		c.Inj.Add(rule)
		return fmt.Sprintf("on %s, %d calls, delay %v", which, rule.Times, rule.Delay), nil
	}
}

// shutDownAClient calls Shutdown on a client drawn at random: its holds and waiters end.
func shutDownAClient(ctx context.Context, x *exploration) (string, error) {
	c, which := x.client()
	return which, core.Shutdown(ctx, c.Client)
}

// compactNow compacts the store to the current revision, past the token of every live
// hold, and physically (as etcd's auto-compaction does): a hold whose watch is placed from
// now on, from the revision after its token, finds that history gone.
func compactNow(ctx context.Context, x *exploration) (string, error) {
	resp, err := x.r.env.Admin.Get(ctx, "\x00")
	if err != nil {
		return "", err
	}
	_, err = x.r.env.Admin.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
	return fmt.Sprintf("at %d", resp.Header.Revision), err
}

// compactThenRestart compacts (compactNow), then stops a member drawn at random and starts
// it again: the clients it served reconnect, and every watch they had is placed again from
// a compacted revision.
func compactThenRestart(ctx context.Context, x *exploration) (string, error) {
	detail, err := compactNow(ctx, x)
	if err != nil {
		return detail, err
	}
	m := x.rng.IntN(x.r.env.Cluster.Size())
	detail += fmt.Sprintf(", member %d", m)
	x.r.env.Cluster.Stop(m)
	x.r.wait(time.Duration(200+x.rng.IntN(800)) * time.Millisecond)
	if err := x.r.env.Cluster.Restart(m); err != nil {
		return detail, fmt.Errorf("restart member %d: %w", m, err)
	}
	_, err = x.r.env.leader(ctx)
	return detail, err
}

// changeTheAuthStore adds a user: every client's token is old from then on (see
// Env.changeAuth).
func changeTheAuthStore(ctx context.Context, x *exploration) (string, error) {
	return x.r.env.changeAuth(ctx)
}

// partitionAMember cuts a member drawn at random off from its peers for one to three
// seconds.
func partitionAMember(ctx context.Context, x *exploration) (string, error) {
	m := x.rng.IntN(x.r.env.Cluster.Size())
	x.r.env.Cluster.Partition(m)
	x.r.wait(time.Duration(1000+x.rng.IntN(2000)) * time.Millisecond)
	x.r.env.Cluster.Heal(m)
	_, err := x.r.env.leader(ctx)
	return fmt.Sprintf("member %d", m), err
}

// stopTheLeader stops the leader, lets the others go on for a moment, and restarts it.
// stopAMajority stops two of the three members, the leader among them or not, gracefully
// (the leader hands over first) or killed, for a third of the TTL to three TTLs, then starts
// them again: the member left has no leader, so nothing is served and no renewal gets
// through, and holds cut off past their local deadline must end before anyone is served.
func stopAMajority(ctx context.Context, x *exploration) (string, error) {
	leader, err := x.r.env.leader(ctx)
	if err != nil {
		return "", err
	}
	n := x.r.env.Cluster.Size()
	down := []int{leader, (leader + 1) % n}
	if x.rng.IntN(2) == 0 {
		down = []int{(leader + 1) % n, (leader + 2) % n} // the leader stays, without a quorum
	}
	stop, how := (*etcdtest.Cluster).Stop, "stopped"
	if x.rng.IntN(2) == 0 {
		stop, how = (*etcdtest.Cluster).Kill, "killed"
	}
	d := time.Duration(float64(x.r.w.TTL) * (1.0/3 + x.rng.Float64()*8/3))
	detail := fmt.Sprintf("members %v (leader %d) %s for %v", down, leader, how, d.Round(time.Millisecond))
	for _, i := range down {
		stop(x.r.env.Cluster, i)
	}
	x.r.wait(d)
	if err := x.r.env.Cluster.RestartAll(down...); err != nil {
		return detail, err
	}
	_, err = x.r.env.leader(ctx)
	return detail, err
}

func stopTheLeader(ctx context.Context, x *exploration) (string, error) {
	leader, err := x.r.env.leader(ctx)
	if err != nil {
		return "", err
	}
	detail := fmt.Sprintf("member %d", leader)
	x.r.env.Cluster.Stop(leader)
	x.r.wait(time.Duration(500+x.rng.IntN(1500)) * time.Millisecond)
	if err := x.r.env.Cluster.Restart(leader); err != nil {
		return detail, fmt.Errorf("restart member %d: %w", leader, err)
	}
	_, err = x.r.env.leader(ctx)
	return detail, err
}
