package etcdtest

import (
	"fmt"

	"go.etcd.io/etcd/client/pkg/v3/types"
)

// A partition cuts a member off from its peers in both directions, at two levels:
//
//   - its peer proxy drops every byte of the connections its peers open to it: their raft
//     messages to it (pipelines) and their streams of its raft messages to them;
//   - the raft transports of it and of its peers drop the raft messages they exchange over
//     the connections it opens itself (EtcdServer.CutPeer on both ends), which no proxy of
//     its own sees: its pipelines to them and its streams of their messages.
//
// The proxy alone is not a partition: measured, a member behind a black-holed proxy keeps
// hearing the leader over the streams it opened, and keeps forwarding its clients' lease
// keep-alives to it, indefinitely. What stays open is only the member's own HTTP calls that
// are not raft messages (lease forwarding, version checks), which need a leader it no longer
// hears of after an election timeout.

// Partitioned reports whether member i is cut off from its peers by Partition. It panics on
// an external cluster or one started without WithPeerProxies.
func (c *Cluster) Partitioned(i int) bool {
	m := c.proxied(i)
	c.cuts.Lock()
	defer c.cuts.Unlock()
	return m.partitioned
}

// Partition cuts member i off from its peers until Heal(i), also across restarts of any
// member. It panics on an external cluster or one started without WithPeerProxies.
func (c *Cluster) Partition(i int) {
	m := c.proxied(i)
	c.cuts.Lock()
	defer c.cuts.Unlock()
	m.partitioned = true
	m.peerProxy.Blackhole()
	c.applyCuts()
}

// Heal undoes Partition(i).
func (c *Cluster) Heal(i int) {
	m := c.proxied(i)
	c.cuts.Lock()
	defer c.cuts.Unlock()
	m.partitioned = false
	m.peerProxy.Restore()
	c.applyCuts()
}

func (c *Cluster) proxied(i int) *member {
	m := c.member(i)
	if m.peerProxy == nil {
		panic(fmt.Sprintf("etcdtest: member %d has no peer proxy: start the cluster WithPeerProxies", i))
	}
	return m
}

// applyCuts makes the raft transport of every running member drop the messages to and from
// each peer that it or the peer is partitioned from, and only those. Under cuts.
func (c *Cluster) applyCuts() {
	ids := make([]types.ID, len(c.members))
	for i, m := range c.members {
		if e := m.etcd.Load(); e != nil {
			ids[i] = e.Server.MemberID()
		}
	}
	for i, m := range c.members {
		e := m.etcd.Load()
		if e == nil {
			continue
		}
		for j, peer := range c.members {
			switch {
			case j == i || ids[j] == 0:
			case m.partitioned || peer.partitioned:
				e.Server.CutPeer(ids[j])
			default:
				e.Server.MendPeer(ids[j])
			}
		}
	}
}
