package core

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrMixedClusters is why an acquisition fails when the client's endpoints are members of
// different etcd clusters: its balancer takes requests to them in turn, so a lease granted
// by one is "not found" by the other, and a lock taken on one excludes nobody on the other.
// The error names each cluster's ID in hex, as etcd prints it. No retry helps: fix the
// endpoints.
var ErrMixedClusters = errors.New("etcdsync: the client's endpoints are members of different etcd clusters")

// probeWait bounds the check of the endpoints' clusters, and the revoke of a lease that a
// cluster other than the one that refused it granted.
const probeWait = 2 * time.Second

// clustersOf asks each endpoint of cli, at once, for its cluster's ID: one Status on a
// connection to that endpoint alone, with the client's credentials. It returns the
// endpoints of each cluster ID; an endpoint that does not answer within probeWait is left out.
func clustersOf(ctx context.Context, cli *clientv3.Client) map[uint64][]string {
	ctx, cancel := context.WithTimeout(ctx, probeWait)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	found := map[uint64][]string{}
	for _, ep := range cli.Endpoints() {
		wg.Go(func() {
			resp, err := cli.Maintenance.Status(ctx, ep)
			if err != nil || resp.Header == nil || resp.Header.ClusterId == 0 {
				return
			}
			mu.Lock()
			found[resp.Header.ClusterId] = append(found[resp.Header.ClusterId], ep)
			mu.Unlock()
		})
	}
	wg.Wait()
	return found
}

// OneCluster returns ErrMixedClusters, naming each cluster and its endpoints, if the
// endpoints of cli that answer within 2 s are members of different clusters; else nil. It
// costs a connection and a Status per endpoint.
func OneCluster(ctx context.Context, cli *clientv3.Client) error {
	return mixedClusters(clustersOf(ctx, cli))
}

// mixedClusters is ErrMixedClusters naming each cluster of found and its endpoints, or nil
// if found holds one cluster or none.
func mixedClusters(found map[uint64][]string) error {
	if len(found) < 2 {
		return nil
	}
	var each []string
	for _, id := range slices.Sorted(maps.Keys(found)) {
		each = append(each, fmt.Sprintf("cluster %x at %s", id, strings.Join(slices.Sorted(slices.Values(found[id])), ", ")))
	}
	return fmt.Errorf("%w: %s", ErrMixedClusters, strings.Join(each, "; "))
}

// revokeOn revokes lease id through the endpoints of one cluster, one after the other until
// one answers, within probeWait: the balancer could take the revoke to another cluster,
// which would only say "not found". Best effort: a lease left behind expires after its TTL.
func revokeOn(ctx context.Context, cli *clientv3.Client, endpoints []string, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), probeWait)
	defer cancel()
	for _, ep := range endpoints {
		conn, err := cli.Dial(ep)
		if err != nil {
			continue
		}
		_, err = pb.NewLeaseClient(conn).LeaseRevoke(ctx, &pb.LeaseRevokeRequest{ID: int64(id)})
		conn.Close()
		if err == nil || errors.Is(rpctypes.Error(err), rpctypes.ErrLeaseNotFound) {
			return
		}
	}
}
