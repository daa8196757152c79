// Command metrics serves the primitives' OpenTelemetry metrics to Prometheus on /metrics
// while workers contend: workers on several etcd clients take one mutex in turn, giving up
// when a wait passes -patience, and try another one without waiting. At the end it scrapes
// its own /metrics and prints the lines of the mutexes' waits, holds and losses. It fails
// if the scrape lacks them.
//
// With no -endpoints and no ETCD_ENDPOINTS it runs on an etcd it embeds. With -listen
// :9464 and -duration 10m a Prometheus can scrape it meanwhile.
//
//	go run ./examples/metrics
//	go run ./examples/metrics -endpoints 127.0.0.1:2379 -listen :9464 -duration 10m
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/etcdsync/etcdsync/examples/internal/demo"
	"github.com/etcdsync/etcdsync/mutex"
)

const (
	sharedLock = "etcdsync-example/metrics-shared"
	nightlyJob = "etcdsync-example/metrics-nightly"
)

func main() {
	endpoints := demo.EndpointsFlag()
	listen := flag.String("listen", "127.0.0.1:0", "address to serve /metrics on")
	clients := flag.Int("clients", 3, "etcd clients, as if separate processes")
	workers := flag.Int("workers", 6, "workers, spread over the clients")
	duration := flag.Duration("duration", 3*time.Second, "how long the workers contend")
	work := flag.Duration("work", 2*time.Millisecond, "how long a worker holds the mutex")
	patience := flag.Duration("patience", 5*time.Millisecond, "how long a worker waits for the mutex before it gives up")
	flag.Parse()
	if err := run(*endpoints, *listen, *clients, *workers, *duration, *work, *patience); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

func run(endpoints, listen string, nClients, nWorkers int, duration, work, patience time.Duration) error {
	if nClients < 1 || nWorkers < 1 {
		return errors.New("-clients and -workers must be at least 1")
	}
	// The global MeterProvider, read through a Prometheus exporter: every primitive made
	// from here on records through it without an option.
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer provider.Shutdown(context.Background())
	otel.SetMeterProvider(provider)

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go server.Serve(ln)
	defer server.Close()
	url := "http://" + ln.Addr().String() + "/metrics"
	fmt.Println("serving", url)

	etcd, err := demo.Start(endpoints)
	if err != nil {
		return err
	}
	defer etcd.Close() // and every client it opened

	shared := make([]*mutex.Mutex, nClients)
	nightly := make([]*mutex.Mutex, nClients)
	for i := range shared {
		cli, err := etcd.Client()
		if err != nil {
			return err
		}
		if shared[i], err = mutex.New(cli, sharedLock); err != nil {
			return err
		}
		if nightly[i], err = mutex.New(cli, nightlyJob); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	errs := make([]error, nWorkers)
	var wg sync.WaitGroup
	for w := range nWorkers {
		// Handles on one client are shared by its workers, as goroutines of one process do.
		wg.Go(func() { errs[w] = contend(ctx, shared[w%nClients], nightly[w%nClients], work, patience) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return printScrape(url)
}

// contend takes the shared mutex over and over until ctx ends, giving up a wait after
// patience, and now and then tries the nightly job's mutex, which another worker may hold.
func contend(ctx context.Context, shared, nightly *mutex.Mutex, work, patience time.Duration) error {
	for i := 0; ctx.Err() == nil; i++ {
		wctx, cancel := context.WithTimeout(ctx, patience)
		err := shared.Lock(wctx)
		cancel()
		switch {
		case err == nil:
			time.Sleep(work) // the work under the lock
			if err := shared.Unlock(context.Background()); err != nil {
				return err
			}
		case ctx.Err() != nil:
			return nil
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		}
		if i%10 == 0 {
			switch err := nightly.TryLock(ctx); {
			case err == nil:
				time.Sleep(work)
				if err := nightly.Unlock(context.Background()); err != nil {
					return err
				}
			case errors.Is(err, mutex.ErrLocked), ctx.Err() != nil:
			default:
				return err
			}
		}
	}
	return nil
}

// printScrape scrapes url and prints its etcdsync lines but the histograms' buckets.
func printScrape(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	want := []string{"etcdsync_acquire_duration_seconds_count", "etcdsync_hold_duration_seconds_count", "etcdsync_holds", "etcdsync_waiters"}
	seen := map[string]bool{}
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		line := lines.Text()
		if !strings.HasPrefix(line, "etcdsync_") || strings.Contains(line, "_bucket{") {
			continue
		}
		fmt.Println(line)
		for _, w := range want {
			if strings.HasPrefix(line, w+"{") {
				seen[w] = true
			}
		}
	}
	if err := lines.Err(); err != nil {
		return err
	}
	for _, w := range want {
		if !seen[w] {
			return fmt.Errorf("the scrape has no %s", w)
		}
	}
	return nil
}
