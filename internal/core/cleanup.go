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

// keysCleanup is the chore of removing the keys of an acquisition that did not become a
// hold. Their slots stay claimed until the keys are known to be gone, so that a delete
// etcd applies late can never take the key of a slot's next acquisition.
type keysCleanup struct {
	cli   *clientv3.Client
	slots []*slot
	revs  []int64 // each key's create revision; 0 for a key known to be absent
	known bool    // revs are known; else they are read first
}

// attempt deletes the keys in one Txn, each fenced on its create revision (read first in
// one Txn if not known), so that it never takes a later key of the same slots.
//
// It deletes also on a session that ended: a session that ends at its local deadline has its
// lease revoked, but etcd may have kept the lease (a new leader extends leases), and the
// revoke may not get through for a while.
func (c *keysCleanup) attempt(ctx context.Context) bool {
	if !c.known {
		reads := make([]clientv3.Op, len(c.slots))
		for i, sl := range c.slots {
			reads[i] = clientv3.OpGet(sl.key(), clientv3.WithKeysOnly())
		}
		resp, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(reads...).Commit()
		if err != nil {
			return c.refused(err)
		}
		for i := range c.slots {
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) == 1 {
				c.revs[i] = kvs[0].CreateRevision
			}
		}
		c.known = true
	}
	var deletes []clientv3.Op
	for i, sl := range c.slots {
		if c.revs[i] != 0 {
			deletes = append(deletes, fencedDelete(sl.key(), c.revs[i]))
		}
	}
	if len(deletes) > 0 {
		if _, err := c.cli.Txn(clientv3.WithRequireLeader(ctx)).Then(deletes...).Commit(); err != nil {
			return c.refused(err)
		}
	}
	c.drop() // deleted now, or gone before
	return true
}

// refused ends the chore if etcd refused it for good (permission revoked): the keys then go
// with their lease, and a slot's next acquisition, finding its key, takes it over.
func (c *keysCleanup) refused(err error) bool {
	if refused(err) {
		c.drop()
		return true
	}
	return false
}

func (c *keysCleanup) drop() {
	for _, sl := range c.slots {
		sl.free()
	}
}

// fencedDelete is an op that deletes key only if its create revision is rev: a nested Txn,
// so that one Txn can release several keys and say which of them it deleted.
func fencedDelete(key string, rev int64) clientv3.Op {
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", rev)},
		[]clientv3.Op{clientv3.OpDelete(key)}, nil)
}
