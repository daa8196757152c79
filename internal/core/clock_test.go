package core_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/etcdsync/etcdsync/internal/core"
)

// TestAnswersFromAClusterLeftBeforeAreFromMixedClusters: a cluster that goes back in time
// may come back with a new ID (ErrRewound), but never with one it had: answers from a
// cluster, another, then the first again come from two clusters in turn.
func TestAnswersFromAClusterLeftBeforeAreFromMixedClusters(t *testing.T) {
	a := &pb.ResponseHeader{ClusterId: 0xa1, Revision: 5}
	b := &pb.ResponseHeader{ClusterId: 0xb2, Revision: 3}
	errs := core.ClockSees(a, b, a)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], core.ErrRewound)
	assert.NotErrorIs(t, errs[1], core.ErrMixedClusters)
	assert.ErrorIs(t, errs[2], core.ErrMixedClusters)
	assert.ErrorContains(t, errs[2], "cluster a1 and cluster b2")
}
