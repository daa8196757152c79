package realbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The server counters read from every member's /metrics (Prometheus text format, served on
// the client URL by etcd 3.4 to 3.6), all without labels.
const (
	walSyncs       = "etcd_disk_wal_fsync_duration_seconds_count" // WAL fsyncs
	walSyncSeconds = "etcd_disk_wal_fsync_duration_seconds_sum"   // their time in all
	proposals      = "etcd_server_proposals_committed_total"      // raft proposals committed
	cpuSeconds     = "process_cpu_seconds_total"                  // the member's CPU, user and system
)

var serverCounters = []string{walSyncs, walSyncSeconds, proposals, cpuSeconds}

// parseMetrics reads the samples without labels of a Prometheus text exposition: lines
// "name value" or "name value timestamp"; comments, blank lines and labelled samples
// ("name{...} value") are skipped, and so is a line whose value is not a number.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 || len(fields) > 3 {
			continue
		}
		v, err := strconv.ParseFloat(fields[1], 64)
		if err != nil {
			continue
		}
		out[fields[0]] = v
	}
	return out, sc.Err()
}

// A scraper reads the server counters of every member of a cluster.
type scraper struct {
	urls   []string // each member's /metrics
	client *http.Client
}

// newScraper reads from the members at endpoints (client URLs); tr carries the cluster's
// client TLS, if any.
func newScraper(endpoints []string, tr *http.Transport) *scraper {
	s := &scraper{client: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
	for _, ep := range endpoints {
		s.urls = append(s.urls, strings.TrimSuffix(ep, "/")+"/metrics")
	}
	return s
}

// sample returns the server counters of every member, in member order; it fails if a member's
// /metrics cannot be read or lacks one of them.
func (s *scraper) sample(ctx context.Context) ([]map[string]float64, error) {
	out := make([]map[string]float64, len(s.urls))
	for i, u := range s.urls {
		m, err := s.one(ctx, u)
		if err != nil {
			return nil, fmt.Errorf("member %d: %w", i, err)
		}
		out[i] = m
	}
	return out, nil
}

func (s *scraper) one(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	all, err := parseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	m := make(map[string]float64, len(serverCounters))
	for _, name := range serverCounters {
		v, ok := all[name]
		if !ok {
			return nil, fmt.Errorf("GET %s: no %s", url, name)
		}
		m[name] = v
	}
	return m, nil
}

// A usage is what was spent over one side's round: the server counters' increase (nil if
// they could not be read, with why in err) and the test process's CPU.
type usage struct {
	leader    map[string]float64 // on the leader
	members   map[string]float64 // summed over every member
	clientCPU time.Duration      // of the whole test process
	err       error              // why leader and members are nil
}

// plus is u and v added up: the server counters only if both read them (else the first
// reason either did not), the process's CPU in any case.
func (u *usage) plus(v *usage) *usage {
	sum := &usage{clientCPU: u.clientCPU + v.clientCPU, err: u.err}
	if sum.err == nil {
		sum.err = v.err
	}
	if sum.err != nil {
		return sum
	}
	sum.leader, sum.members = map[string]float64{}, map[string]float64{}
	for _, from := range []*usage{u, v} {
		for name, x := range from.leader {
			sum.leader[name] += x
		}
		for name, x := range from.members {
			sum.members[name] += x
		}
	}
	return sum
}

// diffUsage is the increase of the counters from before to after, on leader and summed.
func diffUsage(before, after []map[string]float64, leader int) (lead, sum map[string]float64) {
	lead, sum = map[string]float64{}, map[string]float64{}
	for i := range after {
		for name, v := range after[i] {
			d := v - before[i][name]
			sum[name] += d
			if i == leader {
				lead[name] = d
			}
		}
	}
	return lead, sum
}

// observed wraps s so that each of its rounds records its usage: the server counters read
// just before and just after the round by sc, and the process's CPU in between. With sc nil
// the server counters are not read, for the reason unread.
func observed(s side, sc *scraper, leader int, unread error) side {
	run := s.run
	s.run = func(ctx context.Context, d time.Duration) (tally, error) {
		var before []map[string]float64
		serr := unread
		if sc != nil {
			before, serr = sc.sample(ctx)
		}
		cpuBefore := processCPU()
		t, err := run(ctx, d)
		u := &usage{clientCPU: processCPU() - cpuBefore, err: serr}
		if serr == nil {
			if after, aerr := sc.sample(ctx); aerr != nil {
				u.err = aerr
			} else {
				u.leader, u.members = diffUsage(before, after, leader)
			}
		}
		t.use = u
		return t, err
	}
	return s
}

// serverFigures are a side's usage per headline op over its rounds.
type serverFigures struct {
	ok                   bool    // the server figures below were read in at least one round
	syncs, syncMs        float64 // WAL fsyncs on the leader per op; the mean time of one, ms
	proposals            float64 // raft proposals committed per op, on the leader
	etcdCPUMs, leaderCPU float64 // ms of CPU per op of every member, of the leader alone
	clientOK             bool    // clientCPUMs was measured
	clientCPUMs          float64 // ms of the test process's CPU per op
}

// usePerOp adds up the usage of the rounds of a side and divides it by their headline ops
// (all of them, also those under way at the end, whose work the counters saw): the server
// figures over the rounds in which they were read, the client CPU over every round.
func usePerOp(ts []tally) serverFigures {
	var f serverFigures
	var ops, serverOps float64
	var client time.Duration
	lead, sum := map[string]float64{}, map[string]float64{}
	for _, t := range ts {
		if t.use == nil || len(t.counts) == 0 {
			continue
		}
		n := float64(t.counts[0].all)
		ops += n
		client += t.use.clientCPU
		if t.use.leader == nil {
			continue
		}
		serverOps += n
		for _, name := range serverCounters {
			lead[name] += t.use.leader[name]
			sum[name] += t.use.members[name]
		}
	}
	if ops > 0 && haveProcessCPU {
		f.clientOK = true
		f.clientCPUMs = float64(client.Microseconds()) / 1000 / ops
	}
	if serverOps > 0 {
		f.ok = true
		f.syncs = lead[walSyncs] / serverOps
		if lead[walSyncs] > 0 {
			f.syncMs = lead[walSyncSeconds] / lead[walSyncs] * 1000
		}
		f.proposals = lead[proposals] / serverOps
		f.etcdCPUMs = sum[cpuSeconds] * 1000 / serverOps
		f.leaderCPU = lead[cpuSeconds] * 1000 / serverOps
	}
	return f
}

// usageErr returns the first reason a round of ts lacks server figures, and how many do.
func usageErr(ts []tally) (missing int, first error) {
	for _, t := range ts {
		if t.use != nil && t.use.err != nil {
			missing++
			if first == nil {
				first = t.use.err
			}
		}
	}
	return missing, first
}

// reportUsage reports the usage per op of side s (see report) and adds it to line.
func reportUsage(b *testing.B, line *strings.Builder, s string, ts []tally) {
	if len(ts) == 0 || len(ts[0].counts) == 0 {
		return
	}
	op := ts[0].counts[0].op
	f := usePerOp(ts)
	if !f.ok && !f.clientOK {
		return
	}
	fmt.Fprintf(line, "; %s", s)
	if f.ok {
		b.ReportMetric(f.syncs, s+"-syncs/"+op)
		fmt.Fprintf(line, " syncs/%s %.3g", op, f.syncs)
		if f.syncs > 0 {
			b.ReportMetric(f.syncMs, s+"-sync-ms/sync")
			fmt.Fprintf(line, " (%.3g ms each)", f.syncMs)
		}
		b.ReportMetric(f.proposals, s+"-proposals/"+op)
		b.ReportMetric(f.etcdCPUMs, s+"-etcdCPU-ms/"+op)
		b.ReportMetric(f.leaderCPU, s+"-leaderCPU-ms/"+op)
		fmt.Fprintf(line, " proposals/%s %.3g etcdCPU-ms/%s %.3g (leader %.3g)", op, f.proposals, op, f.etcdCPUMs, f.leaderCPU)
	}
	if f.clientOK {
		b.ReportMetric(f.clientCPUMs, s+"-clientCPU-ms/"+op)
		fmt.Fprintf(line, " clientCPU-ms/%s %.3g", op, f.clientCPUMs)
	}
}
