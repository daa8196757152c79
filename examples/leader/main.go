// Command leader runs replicas, each on its own etcd client, that campaign to lead one
// election. The leader does periodic work, a counter in etcd, with every write fenced by
// its leadership (a Txn that applies only while it leads). Part-way the program revokes the
// leader's lease, as a crash or a partition would end it: another replica takes over with a
// higher token, and the deposed leader's next fenced write is refused. Each replica runs
// election.Run, the leader loop, with a health check. An observer prints every change of
// leader.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/leader
//	go run ./examples/leader -endpoints 127.0.0.1:2379 -replicas 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/examples/internal/demo"
)

const (
	electionName = "etcdsync-example-leader" // no '/': etcdctl elect sees the same election
	counterKey   = "etcdsync-example/leader-counter"
	workEvery    = 50 * time.Millisecond
)

func main() {
	endpoints := demo.EndpointsFlag()
	replicas := flag.Int("replicas", 3, "replicas, each on its own client")
	flag.Parse()
	if err := run(*endpoints, *replicas); err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

func run(endpoints string, replicas int) error {
	if replicas < 2 {
		return errors.New("-replicas must be at least 2, to show a hand-over")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := etcd.Client()
	if err != nil {
		return err
	}
	if _, err := admin.Put(ctx, counterKey, "0"); err != nil {
		return fmt.Errorf("reset the counter: %w", err)
	}

	// The observer prints each leader and checks that tokens only rise.
	watcher, err := election.New(admin, electionName)
	if err != nil {
		return err
	}
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	firstLeader, secondLeader := make(chan int64, 1), make(chan int64, 1)
	observed := make(chan error, 1)
	go func() { observed <- observe(octx, watcher, firstLeader, secondLeader) }()

	var stats stats
	rctx, stopReplicas := context.WithCancel(ctx)
	defer stopReplicas()
	var wg sync.WaitGroup
	for i := range replicas {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		e, err := election.New(cli, electionName, election.WithTTL(5*time.Second))
		if err != nil {
			return err
		}
		wg.Go(func() { replica(rctx, i, cli, e, &stats) })
	}

	// Let the first leader work a while, then end its leadership behind its back.
	var token int64
	select {
	case token = <-firstLeader:
	case <-ctx.Done():
		return errors.New("no replica came to lead")
	}
	time.Sleep(time.Second) // the demo's pace: let the first leader do some work
	fmt.Printf("-- revoking the lease of the leader with token %d\n", token)
	if err := revokeLeader(ctx, admin); err != nil {
		return err
	}
	select {
	case <-secondLeader:
	case <-ctx.Done():
		return errors.New("no replica took over")
	}
	time.Sleep(time.Second)
	stopReplicas()
	wg.Wait()
	stopObserving()
	if err := <-observed; err != nil {
		return err
	}

	resp, err := admin.Get(ctx, counterKey)
	if err != nil {
		return fmt.Errorf("read the counter: %w", err)
	}
	got, want := string(resp.Kvs[0].Value), strconv.FormatInt(stats.applied.Load(), 10)
	fmt.Printf("counter = %s after %s fenced writes applied; %d refused (by deposed leaders)\n", got, want, stats.refused.Load())
	if got != want {
		return errors.New("the counter does not match the writes applied")
	}
	if stats.refused.Load() == 0 {
		return errors.New("the deposed leader's fenced write was not refused")
	}
	return nil
}

type stats struct{ applied, refused atomic.Int64 }

// replica runs the leader loop until ctx ends (election.Run): it campaigns, works while it
// leads, resigns after a loss and campaigns again. Its health check, a read through its own
// client, makes it step down when it cannot reach etcd itself.
func replica(ctx context.Context, id int, cli *clientv3.Client, e *election.Election, st *stats) {
	healthy := func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := cli.Get(ctx, counterKey)
		return err
	}
	err := e.Run(ctx, fmt.Sprintf("replica-%d", id), func(lctx context.Context) error {
		fmt.Printf("replica %d: leading with token %d\n", id, e.Token())
		lead(lctx, id, cli, e, st)
		return nil
	}, election.WithHealthCheck(time.Second, healthy))
	if err != nil && ctx.Err() == nil {
		fmt.Printf("replica %d: %v\n", id, err)
	}
}

// lead does the leader's work every workEvery until its ctx ends: when the leadership is
// lost (the cause matches ErrLost), or the program stops. After a loss it tries one more
// write, as a leader that paused and woke up late would: the fence refuses it.
func lead(ctx context.Context, id int, cli *clientv3.Client, e *election.Election, st *stats) {
	tick := time.NewTicker(workEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.Is(cause, election.ErrLost) {
				fmt.Printf("replica %d: leadership lost (%v)\n", id, cause)
				late, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				if applied, err := fencedIncrement(late, cli, e); err == nil && !applied {
					st.refused.Add(1)
					fmt.Printf("replica %d: late fenced write with token %d refused\n", id, e.Token())
				}
			}
			return
		case <-tick.C:
			applied, err := fencedIncrement(ctx, cli, e)
			switch {
			case err != nil:
				return // ctx ended
			case applied:
				st.applied.Add(1)
			default:
				st.refused.Add(1)
			}
		}
	}
}

// fencedIncrement adds one to the counter if e still leads: the Txn compares e.IsOwner()
// and the counter's revision as read, so neither a deposed leader nor a lost race writes.
func fencedIncrement(ctx context.Context, cli *clientv3.Client, e *election.Election) (bool, error) {
	resp, err := cli.Get(ctx, counterKey)
	if err != nil {
		return false, err
	}
	n, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return false, err
	}
	txn, err := cli.Txn(ctx).
		If(e.IsOwner(), clientv3.Compare(clientv3.ModRevision(counterKey), "=", resp.Kvs[0].ModRevision)).
		Then(clientv3.OpPut(counterKey, strconv.Itoa(n+1))).
		Commit()
	if err != nil {
		return false, err
	}
	return txn.Succeeded, nil
}

// observe prints every leader until ctx ends, reports the first two leaders' tokens, and
// fails if a token ever goes down.
func observe(ctx context.Context, e *election.Election, first, second chan<- int64) error {
	var last int64
	leaders := 0
	for l := range e.Observe(ctx) {
		switch {
		case l.Token == 0:
			fmt.Println("observer: no leader")
			continue
		case l.Token < last:
			return fmt.Errorf("observer: token %d after %d", l.Token, last)
		case l.Token == last:
			continue // a proclaimed value: this example proclaims none
		}
		fmt.Printf("observer: %s leads, token %d\n", l.Value, l.Token)
		last = l.Token
		leaders++
		switch leaders {
		case 1:
			first <- l.Token
		case 2:
			second <- l.Token
		}
	}
	return nil
}

// revokeLeader revokes the lease of the election's first key, as an expiry would end it.
func revokeLeader(ctx context.Context, admin *clientv3.Client) error {
	resp, err := admin.Get(ctx, electionName+"/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 {
		return fmt.Errorf("find the leader's key: %v", err)
	}
	_, err = admin.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	return err
}
