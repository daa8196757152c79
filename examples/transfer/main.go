// Command transfer moves money between accounts held in etcd: workers on separate clients
// each pick two accounts at random and move an amount from one to the other, under a
// mutex.Multi of both accounts' names. The two balances are read, and written back in one
// Txn fenced by the Multi (IsOwner: a compare per account), so a transfer whose hold was
// lost writes nothing and is tried again. Workers list the accounts in whatever order
// their transfer has them; the Multi never deadlocks. At the end it checks that the total
// of every balance is what it was, and says so.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/transfer
//	go run ./examples/transfer -endpoints 127.0.0.1:2379 -workers 16 -transfers 100
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/mutex"
)

const (
	accountPrefix  = "etcdsync-example/transfer/account-" // a balance per account
	startBalance   = 1000
	lockNamePrefix = "etcdsync-example/transfer/lock-" // the lock of each account
)

func main() {
	endpoints := demo.EndpointsFlag()
	workers := flag.Int("workers", 8, "workers, each on its own client")
	accounts := flag.Int("accounts", 16, "accounts, from 2 to 64")
	transfers := flag.Int("transfers", 50, "transfers per worker")
	flag.Parse()
	if err := run(*endpoints, *workers, *accounts, *transfers); err != nil {
		fmt.Fprintln(os.Stderr, "transfer:", err)
		os.Exit(1)
	}
}

func run(endpoints string, workers, accounts, transfers int) error {
	if workers < 1 || transfers < 1 || accounts < 2 || accounts > mutex.MaxNames {
		return errors.New("-workers and -transfers must be at least 1, -accounts from 2 to 64")
	}
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	clients := make([]*clientv3.Client, workers)
	for i := range clients {
		if clients[i], err = etcd.Client(); err != nil {
			return err
		}
	}
	for a := range accounts {
		if _, err := clients[0].Put(ctx, accountKey(a), strconv.Itoa(startBalance)); err != nil {
			return fmt.Errorf("open account %d: %w", a, err)
		}
	}

	start := time.Now()
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i, cli := range clients {
		rng := rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
		wg.Go(func() {
			for range transfers {
				from := rng.IntN(accounts)
				to := (from + 1 + rng.IntN(accounts-1)) % accounts
				if errs[i] = transfer(ctx, cli, from, to, 1+rng.IntN(100)); errs[i] != nil {
					cancel() // the others stop too
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	elapsed := time.Since(start)

	total, err := totalBalance(ctx, clients[0], accounts)
	if err != nil {
		return err
	}
	fmt.Printf("total = %d (expected %d) after %d transfers by %d workers between %d accounts\n",
		total, accounts*startBalance, workers*transfers, workers, accounts)
	fmt.Printf("%.0f transfers/s\n", float64(workers*transfers)/elapsed.Seconds())
	if total != accounts*startBalance {
		return errors.New("the total changed: money was made or lost")
	}
	fmt.Println("the total never changed")
	return nil
}

func accountKey(a int) string { return accountPrefix + strconv.Itoa(a) }

// transfer moves amount from account from to account to, under a Multi of both accounts'
// locks (listed in the transfer's own order: the Multi sorts them). Should the hold be
// lost between the reads and the write, the write does not apply and the transfer is done
// again under a new hold.
func transfer(ctx context.Context, cli *clientv3.Client, from, to, amount int) error {
	m, err := mutex.NewMulti(cli, []string{lockNamePrefix + strconv.Itoa(from), lockNamePrefix + strconv.Itoa(to)})
	if err != nil {
		return err
	}
	for {
		applied := false
		err := m.Do(ctx, func(ctx context.Context) error {
			var err error
			applied, err = fencedMove(ctx, cli, m, from, to, amount)
			return err
		})
		switch {
		case applied:
			return nil
		case err != nil && !errors.Is(err, mutex.ErrLost):
			return err
		}
	}
}

// fencedMove reads both balances and writes both new ones in one Txn that applies only
// while every key of m is its own. An account short of amount moves what it has.
func fencedMove(ctx context.Context, cli *clientv3.Client, m *mutex.Multi, from, to, amount int) (bool, error) {
	balances := make([]int, 2)
	for i, a := range []int{from, to} {
		resp, err := cli.Get(ctx, accountKey(a))
		if err != nil {
			return false, fmt.Errorf("read account %d: %w", a, err)
		}
		if balances[i], err = strconv.Atoi(string(resp.Kvs[0].Value)); err != nil {
			return false, fmt.Errorf("account %d holds %q: %w", a, resp.Kvs[0].Value, err)
		}
	}
	amount = min(amount, balances[0])
	txn, err := cli.Txn(ctx).If(m.IsOwner()...).Then(
		clientv3.OpPut(accountKey(from), strconv.Itoa(balances[0]-amount)),
		clientv3.OpPut(accountKey(to), strconv.Itoa(balances[1]+amount)),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("write: %w", err)
	}
	return txn.Succeeded, nil
}

func totalBalance(ctx context.Context, cli *clientv3.Client, accounts int) (int, error) {
	resp, err := cli.Get(ctx, accountPrefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("read the accounts: %w", err)
	}
	if len(resp.Kvs) != accounts {
		return 0, fmt.Errorf("%d accounts, expected %d", len(resp.Kvs), accounts)
	}
	total := 0
	for _, kv := range resp.Kvs {
		n, err := strconv.Atoi(string(kv.Value))
		if err != nil {
			return 0, fmt.Errorf("%s holds %q: %w", kv.Key, kv.Value, err)
		}
		total += n
	}
	return total, nil
}
