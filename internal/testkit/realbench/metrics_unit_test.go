package realbench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// etcdMetrics is a piece of etcd 3.4.23's /metrics: comments, a histogram's labelled buckets
// beside its unlabelled _sum and _count, a labelled counter and the unlabelled ones we read.
const etcdMetrics = `# HELP etcd_disk_wal_fsync_duration_seconds The latency distributions of fsync called by WAL.
# TYPE etcd_disk_wal_fsync_duration_seconds histogram
etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 2
etcd_disk_wal_fsync_duration_seconds_bucket{le="+Inf"} 5
etcd_disk_wal_fsync_duration_seconds_sum 0.007539073
etcd_disk_wal_fsync_duration_seconds_count 5
# HELP etcd_server_is_leader Whether or not this member is a leader. 1 if is, 0 otherwise.
# TYPE etcd_server_is_leader gauge
etcd_server_is_leader 1
# HELP etcd_server_proposals_committed_total The total number of consensus proposals committed.
# TYPE etcd_server_proposals_committed_total gauge
etcd_server_proposals_committed_total 4

# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 7
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 0.1
process_start_time_seconds 1.79e+09 1795000000000
`

// TestParseMetricsReadsUnlabelledSamples: comments, blank lines and labelled samples are
// skipped; a sample may carry a timestamp and a value in exponent form.
func TestParseMetricsReadsUnlabelledSamples(t *testing.T) {
	got, err := parseMetrics(strings.NewReader(etcdMetrics))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{
		walSyncSeconds:               0.007539073,
		walSyncs:                     5,
		"etcd_server_is_leader":      1,
		proposals:                    4,
		cpuSeconds:                   0.1,
		"process_start_time_seconds": 1.79e9,
	}, got)
}

// TestScraperReadsEveryMemberOrFails: the four counters of each member, in member order; a
// member without /metrics, or without one of them, fails the sample.
func TestScraperReadsEveryMemberOrFails(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(etcdMetrics))
	}))
	defer ok.Close()
	partial := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("etcd_server_proposals_committed_total 4\n"))
	}))
	defer partial.Close()
	missing := httptest.NewServer(http.NotFoundHandler())
	defer missing.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx := context.Background()

	got, err := newScraper([]string{ok.URL, ok.URL + "/"}, tr).sample(ctx)
	require.NoError(t, err)
	want := map[string]float64{walSyncs: 5, walSyncSeconds: 0.007539073, proposals: 4, cpuSeconds: 0.1}
	assert.Equal(t, []map[string]float64{want, want}, got)

	_, err = newScraper([]string{ok.URL, missing.URL}, tr).sample(ctx)
	assert.ErrorContains(t, err, "member 1")
	assert.ErrorContains(t, err, "404")
	_, err = newScraper([]string{partial.URL}, tr).sample(ctx)
	assert.ErrorContains(t, err, "no "+walSyncs)
}

// TestUsagePerOp: the leader's increase and every member's are divided by the headline ops
// of the rounds in which they were read; the client CPU by those of every round.
func TestUsagePerOp(t *testing.T) {
	before := []map[string]float64{
		{walSyncs: 10, walSyncSeconds: 1, proposals: 100, cpuSeconds: 5},
		{walSyncs: 10, walSyncSeconds: 1, proposals: 100, cpuSeconds: 7},
	}
	after := []map[string]float64{
		{walSyncs: 110, walSyncSeconds: 1.2, proposals: 300, cpuSeconds: 5.5},
		{walSyncs: 60, walSyncSeconds: 1.1, proposals: 300, cpuSeconds: 7.1},
	}
	lead, sum := diffUsage(before, after, 0)
	ts := []tally{
		{time.Second, []count{{op: "cycle", within: 90, all: 100}, {op: "write", all: 1000}}, &usage{leader: lead, members: sum, clientCPU: 200 * time.Millisecond}},
		{time.Second, []count{{op: "cycle", within: 90, all: 100}}, &usage{clientCPU: 100 * time.Millisecond, err: assert.AnError}},
		{time.Second, []count{{op: "cycle", all: 50}}, nil}, // not observed: left out of both
	}
	f := usePerOp(ts)
	assert.True(t, f.ok)
	assert.InDelta(t, 1, f.syncs, 1e-9)
	assert.InDelta(t, 2, f.syncMs, 1e-9)
	assert.InDelta(t, 2, f.proposals, 1e-9)
	assert.InDelta(t, 6, f.etcdCPUMs, 1e-9)
	assert.InDelta(t, 5, f.leaderCPU, 1e-9)
	assert.Equal(t, haveProcessCPU, f.clientOK)
	if haveProcessCPU {
		assert.InDelta(t, 1.5, f.clientCPUMs, 1e-9)
	}
	missing, why := usageErr(ts)
	assert.Equal(t, 1, missing)
	assert.ErrorIs(t, why, assert.AnError)

	none := usePerOp(ts[1:2])
	assert.False(t, none.ok, "no server figures without a round that read them")
}

// TestObservedRecordsUsageOrWhyNot: a side wrapped without a scraper still measures the
// process's CPU and keeps the reason the servers were not read.
func TestObservedRecordsUsageOrWhyNot(t *testing.T) {
	s := side{name: "ours", run: func(context.Context, time.Duration) (tally, error) {
		return tally{time.Second, []count{{op: "cycle", all: 1}}, nil}, nil
	}}
	got, err := observed(s, nil, 0, assert.AnError).run(context.Background(), time.Second)
	require.NoError(t, err)
	require.NotNil(t, got.use)
	assert.ErrorIs(t, got.use.err, assert.AnError)
	assert.Nil(t, got.use.leader)
}
