package core

import (
	"context"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// clientState is everything core keeps for one client: its shared sessions (one per TTL),
// its watches on names (hubs), the watch of its holds' keys, the cleanups still to do, and
// what it has seen of the cluster's history. It lives as long as the client: closing the
// client ends every goroutine of it (each runs under the client's context) and drops it.
// Its goroutines run only while there is work: a hub while a name is watched, the keyWatch
// while a hold is, the janitor while a cleanup is left; after Shutdown nothing is left but
// the clock, which keeps tokens from going back should the cluster do so.
type clientState struct {
	cli     *clientv3.Client
	clock   clock
	janitor janitor
	keys    *keyWatch

	mu     sync.Mutex // guards shared and hubs; never held while a hub's lock is awaited for long
	shared map[int64]*sharedSession
	hubs   map[hubKey]*hub
}

// clients holds the state of every client in use, the one registry of core.
var (
	clientsMu sync.Mutex
	clients   = map[*clientv3.Client]*clientState{}
)

// stateOf returns cli's state, made on first use; it is dropped when the client closes.
func stateOf(cli *clientv3.Client) *clientState {
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if st, ok := clients[cli]; ok {
		return st
	}
	st := &clientState{cli: cli, janitor: janitor{cli: cli}, keys: newKeyWatch(cli),
		shared: map[int64]*sharedSession{}, hubs: map[hubKey]*hub{}}
	clients[cli] = st
	context.AfterFunc(cli.Ctx(), func() {
		clientsMu.Lock()
		delete(clients, cli)
		clientsMu.Unlock()
	})
	return st
}

// clockOf returns the clock of cli.
func clockOf(cli *clientv3.Client) *clock { return &stateOf(cli).clock }

// janitorOf returns the janitor of cli.
func janitorOf(cli *clientv3.Client) *janitor { return &stateOf(cli).janitor }
