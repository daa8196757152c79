package core

import (
	"context"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A chore is cleanup that must be finished although the call that needed it has returned:
// removing the key of an acquisition that failed while etcd could not be reached, or
// releasing a hold its owner gave up. Left undone, such a key sits on a lease the shared
// session keeps renewing, and blocks the name for the client's lifetime.
type chore interface {
	// attempt tries once, under ctx; done when nothing is left to do.
	attempt(ctx context.Context) (done bool)
	// drop gives up: the client is closed, and the lease goes with it.
	drop()
}

// A janitor does the chores of one client in the background, retrying each until it is
// done; its goroutine runs only while it has chores, and ends when the client closes.
type janitor struct {
	cli *clientv3.Client

	mu      sync.Mutex
	chores  []chore
	running bool
}

func (j *janitor) add(c chore) {
	j.mu.Lock()
	j.chores = append(j.chores, c)
	start := !j.running
	j.running = true
	j.mu.Unlock()
	if start {
		go j.run()
	}
}

func (j *janitor) run() {
	var b backoff
	for {
		j.mu.Lock()
		chores := j.chores
		j.chores = nil
		j.mu.Unlock()
		var left []chore
		for _, c := range chores {
			if j.cli.Ctx().Err() != nil {
				c.drop()
				continue
			}
			ctx, cancel := context.WithTimeout(j.cli.Ctx(), tryTimeout)
			if !c.attempt(ctx) {
				left = append(left, c)
			}
			cancel()
		}
		j.mu.Lock()
		j.chores = append(left, j.chores...)
		if len(j.chores) == 0 {
			j.running = false
			j.mu.Unlock()
			return
		}
		j.mu.Unlock()
		if len(left) > 0 {
			_ = b.wait(j.cli.Ctx()) // a closed client drops the chores on the next round
		}
	}
}

// keyCleanup is the chore of removing the key of an acquisition that did not become a hold.
// Its slot stays claimed until the key is known to be gone.
type keyCleanup struct {
	cli  *clientv3.Client
	slot *slot
	key  string
	rev  int64 // the key's create revision; 0 when it is not known whether the key was written
}

// attempt deletes the key, fenced on its create revision (read first if not known), so that
// the delete can never take a later key of the same slot, however late etcd applies it.
//
// It deletes also on a session that ended: a session that ends at its local deadline has its
// lease revoked, but etcd may have kept the lease (a new leader extends leases), and the
// revoke may not get through for a while.
func (c *keyCleanup) attempt(ctx context.Context) bool {
	if c.rev == 0 {
		resp, err := c.cli.Get(clientv3.WithRequireLeader(ctx), c.key)
		switch {
		case err != nil:
			return c.refused(err)
		case len(resp.Kvs) == 0:
			c.slot.free()
			return true
		}
		c.rev = resp.Kvs[0].CreateRevision
	}
	_, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).
		If(clientv3.Compare(clientv3.CreateRevision(c.key), "=", c.rev)).
		Then(clientv3.OpDelete(c.key)).
		Commit()
	if err != nil {
		return c.refused(err)
	}
	c.slot.free() // deleted now, or gone before
	return true
}

// refused ends the chore if etcd refused it for good (permission revoked): the key then goes
// with its lease, and the slot's next acquisition, finding it, takes it over.
func (c *keyCleanup) refused(err error) bool {
	if refused(err) {
		c.slot.free()
		return true
	}
	return false
}

func (c *keyCleanup) drop() { c.slot.free() }
