// Command cron runs one job on several hosts, as a crontab on each would: every host's
// cron fires often, each at its own offset, and the job runs at most once per period, on
// whichever host comes first. Part-way one host's run fails: nothing is recorded, and the
// next host whose cron fires runs the period again. At the end it prints each period's
// runs and checks that no period ran twice.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds.
//
//	go run ./examples/cron
//	go run ./examples/cron -endpoints 127.0.0.1:2379 -hosts 5 -period 3s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/once"
)

const jobName = "etcdsync-example-cron"

func main() {
	endpoints := demo.EndpointsFlag()
	hosts := flag.Int("hosts", 3, "hosts, each on its own client, each with its own cron")
	period := flag.Duration("period", 2*time.Second, "the job's period (1s or more)")
	periods := flag.Int("periods", 4, "how many periods to run through")
	flag.Parse()
	if err := run(*endpoints, *hosts, *period, *periods); err != nil {
		fmt.Fprintln(os.Stderr, "cron:", err)
		os.Exit(1)
	}
}

// runs is what ran: each period's runs, by host, and the failed ones.
type runs struct {
	mu     sync.Mutex
	ok     map[time.Time][]string
	failed map[time.Time][]string
}

func (r *runs) add(start time.Time, host string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ok {
		r.ok[start] = append(r.ok[start], host)
	} else {
		r.failed[start] = append(r.failed[start], host)
	}
}

func run(endpoints string, hosts int, period time.Duration, periods int) error {
	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(periods+2)*period+30*time.Second)
	defer cancel()

	r := &runs{ok: map[time.Time][]string{}, failed: map[time.Time][]string{}}
	var failed atomic.Bool // the first run of the second period fails
	end := time.Now().Truncate(period).Add(time.Duration(periods) * period)
	var wg sync.WaitGroup
	errs := make(chan error, hosts)
	var first time.Time
	for i := range hosts {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		job, err := once.New(cli, jobName, period)
		if err != nil {
			return err
		}
		if i == 0 {
			if err := job.Delete(ctx); err != nil { // what an earlier run left
				return err
			}
			first = time.Now().Truncate(period)
		}
		host := fmt.Sprintf("host-%d", i+1)
		wg.Go(func() {
			// This host's cron: about every period/4, each host at its own pace, so that
			// whose cron fires first in a period varies.
			tick := time.NewTicker(period/4 + time.Duration(i)*period/(10*time.Duration(hosts)))
			defer tick.Stop()
			for time.Now().Before(end) {
				_, err := job.Run(ctx, func(ctx context.Context) error {
					start := once.Start(ctx)
					if start.Equal(first.Add(period)) && failed.CompareAndSwap(false, true) {
						r.add(start, host, false)
						return errDown
					}
					r.add(start, host, true)
					return nil
				})
				if err != nil && !errors.Is(err, errDown) { // a failure of the job is the job's to report
					fmt.Printf("%s: %v\n", host, err)
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					errs <- ctx.Err()
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err, ok := <-errs; ok {
		return err
	}

	starts := make([]time.Time, 0, len(r.ok))
	for s := range r.ok {
		starts = append(starts, s)
	}
	slices.SortFunc(starts, time.Time.Compare)
	twice := 0
	for _, s := range starts {
		line := fmt.Sprintf("period %s: ran on %v", s.Format("15:04:05"), r.ok[s])
		if f := r.failed[s]; len(f) > 0 {
			line += fmt.Sprintf(" (failed first on %v: not recorded, so run again)", f)
		}
		fmt.Println(line)
		if len(r.ok[s]) > 1 {
			twice++
		}
	}
	if twice > 0 {
		return fmt.Errorf("%d periods ran twice", twice)
	}
	fmt.Printf("%d periods, each run once across %d hosts\n", len(starts), hosts)
	cli, err := etcd.Client()
	if err != nil {
		return err
	}
	job, err := once.New(cli, jobName, period)
	if err != nil {
		return err
	}
	return job.Delete(ctx) // the record has no lease: leave nothing behind
}

var errDown = errors.New("the report's database was down")
