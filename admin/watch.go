package admin

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoAnswer: etcd did not answer within the timeout (Timeout).
var ErrNoAnswer = errors.New("etcdsync/admin: no answer from etcd")

// Watch calls changed with the Status of names (or of every name under the prefix, as
// Status finds them), then again after every change of who holds or waits, until ctx ends
// or changed returns an error, which Watch then returns. It opens its watches before it
// reads, so that no change between the read and the watch is missed; a change that arrives
// while it reads makes it read again. A watch that fails (etcd compacted its history, a
// member went away) is opened again, from the present. A change of TTLs alone is no change;
// an ask (Ask) is one, with names given, where the client may read it (a Range each first).
//
// Errors: as Status's; ctx's error once it ends; ErrNoAnswer when etcd does not place the
// watches within the timeout (Timeout), which also bounds each read.
func Watch(ctx context.Context, cli *clientv3.Client, names []string, changed func(*Snapshot) error, opts ...Option) error {
	c, err := configure(names, opts)
	if err != nil {
		return err
	}
	return c.watch(ctx, cli, names, changed)
}

func (c config) watch(ctx context.Context, cli *clientv3.Client, names []string, onChange func(*Snapshot) error) error {
	changed := make(chan struct{}, 1) // a read is due
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ranges := c.rangesOf(names)
	asks, err := c.readableAsks(ctx, cli, names)
	if err != nil {
		return err
	}
	ready := make(chan struct{}, len(ranges)+len(asks))
	relevant := func(string) bool { return true }
	if len(names) == 0 { // what else is under the prefix (the whole keyspace at the root) is no change
		relevant = func(key string) bool {
			_, rest, ok := strings.Cut(strings.TrimPrefix(key, c.prefix), "/")
			return ok && syncKeyShape(rest)
		}
	}
	for _, r := range ranges {
		wg.Go(func() { watchRange(ctx, cli, r, relevant, ready, changed, false) })
	}
	for _, r := range asks {
		wg.Go(func() { watchRange(ctx, cli, r, relevant, ready, changed, true) })
	}
	timeout := time.NewTimer(c.timeout)
	defer timeout.Stop()
	for range len(ranges) + len(asks) {
		select {
		case <-ready:
		case <-timeout.C:
			return fmt.Errorf("%w: the watches were not placed within %v", ErrNoAnswer, c.timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var last *Snapshot
	for {
		rctx, rcancel := context.WithTimeout(ctx, c.timeout)
		snap, err := c.read(rctx, cli, names)
		rcancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return err
		case last == nil || !sameQueues(last, snap):
			if err := onChange(snap); err != nil {
				return err
			}
			last = snap
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// readableAsks are the ranges of the asks beside names that the client may read, to be
// watched: a watch that etcd refuses would end the client's watch stream, and every watch
// on it. One count-only Range each, within the timeout; ErrNoAnswer when etcd does not
// answer one.
func (c config) readableAsks(ctx context.Context, cli *clientv3.Client, names []string) ([]string, error) {
	var asks []string
	for _, n := range names {
		r := askPrefix(c.keyPrefix(n))
		rctx, cancel := context.WithTimeout(ctx, c.timeout)
		_, err := cli.Get(clientv3.WithRequireLeader(rctx), r, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		switch {
		case errors.Is(err, rpctypes.ErrPermissionDenied):
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case err != nil:
			return nil, fmt.Errorf("%w: read %s: %w", ErrNoAnswer, r, err)
		default:
			asks = append(asks, r)
		}
	}
	return asks, nil
}

// watchRange signals changed at every change of a relevant key under prefix until ctx ends,
// and ready once its first watch is in place. An optional range that etcd refuses (the asks
// beside a name, to a grant of its keys alone) is signalled ready and left unwatched.
func watchRange(ctx context.Context, cli *clientv3.Client, prefix string, relevant func(key string) bool, ready, changed chan<- struct{}, optional bool) {
	first := true
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify()) {
			// A refused watch ends with the refusal's text (its stream's error, or the
			// reason it was cancelled, which Err quotes).
			if err := resp.Err(); optional && err != nil && strings.Contains(err.Error(), rpctypes.ErrorDesc(rpctypes.ErrGRPCPermissionDenied)) {
				if first {
					ready <- struct{}{}
				}
				cancel()
				return // out of the client's reach: not followed
			}
			if resp.Created && first {
				first = false
				ready <- struct{}{}
			}
			if resp.Err() != nil || slices.ContainsFunc(resp.Events, func(ev *clientv3.Event) bool { return relevant(string(ev.Kv.Key)) }) {
				select {
				case changed <- struct{}{}:
				default: // a read is due already
				}
			}
			if resp.Err() != nil {
				break
			}
		}
		cancel()
		pause(ctx, 100*time.Millisecond) // no tight loop while etcd is away
	}
}

// pause returns after d or once ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// sameQueues reports whether two snapshots show the same holders and waiters, whatever the
// TTLs they read: Watch reports only what changed.
func sameQueues(a, b *Snapshot) bool {
	strip := func(s *Snapshot) []NameStatus {
		out := make([]NameStatus, len(s.Names))
		for i, n := range s.Names {
			n.Queue = append([]Entry(nil), n.Queue...)
			for j := range n.Queue {
				n.Queue[j].TTL = nil
			}
			out[i] = n
		}
		return out
	}
	return reflect.DeepEqual(strip(a), strip(b))
}
