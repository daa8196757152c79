// Package namespace puts a client's watches inside a key prefix, as etcd's client/v3
// namespace package does, without its race: etcd's NewWatcher panics ("WaitGroup is reused
// before previous Wait has returned") when a Watch is called while Close waits for the
// watches to end, which a program that closes its client while a goroutine of etcdsync
// places a watch (a lingering wait, a hold's monitor) can meet. The command's --namespace
// and the tests' confined clients use it; its KV and Lease wrappers are etcd's.
package namespace

import (
	"bytes"
	"context"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// watcher is a Watcher inside prefix.
type watcher struct {
	clientv3.Watcher
	prefix string

	mu     sync.Mutex
	closed bool           // Close was called: a Watch returns a closed channel
	wg     sync.WaitGroup // the goroutines that pass on events; added to under mu only
	stop   chan struct{}  // closed by Close
}

// NewWatcher returns w with every key of a Watch under prefix, and the prefix cut from the
// keys of the events it delivers.
func NewWatcher(w clientv3.Watcher, prefix string) clientv3.Watcher {
	return &watcher{Watcher: w, prefix: prefix, stop: make(chan struct{})}
}

// Watch watches key (with the range opts give) under the prefix.
func (w *watcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	out := make(chan clientv3.WatchResponse)
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		close(out)
		return out
	}
	w.wg.Add(1)
	w.mu.Unlock()
	// The range the options ask for, read off an OpGet of them (options are opaque).
	end := clientv3.OpGet(key, opts...).RangeBytes()
	if end != nil {
		opts = append(opts, clientv3.WithRange(string(w.end(end))))
	}
	in := w.Watcher.Watch(ctx, w.prefix+key, opts...)
	go func() {
		defer w.wg.Done()
		defer close(out)
		for resp := range in {
			for _, ev := range resp.Events {
				ev.Kv.Key = ev.Kv.Key[len(w.prefix):]
				if ev.PrevKv != nil {
					ev.PrevKv.Key = ev.Kv.Key
				}
			}
			select {
			case out <- resp:
			case <-ctx.Done():
				return
			case <-w.stop:
				return
			}
		}
	}()
	return out
}

// end is the end of a range under the prefix for end, a range's end outside it: "\x00"
// (every key from the key on) becomes the end of the prefix.
func (w *watcher) end(end []byte) []byte {
	if !bytes.Equal(end, []byte{0}) {
		return append([]byte(w.prefix), end...)
	}
	return []byte(clientv3.GetPrefixRangeEnd(w.prefix))
}

// Close closes the wrapped Watcher and waits for every Watch's goroutine to end; a Watch
// after it, or during it, returns a closed channel.
func (w *watcher) Close() error {
	w.mu.Lock()
	first := !w.closed
	w.closed = true
	w.mu.Unlock()
	err := w.Watcher.Close()
	if first {
		close(w.stop)
	}
	w.wg.Wait()
	return err
}
