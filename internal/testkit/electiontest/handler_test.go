package election_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/etcdsync/etcdsync/election"
	"github.com/etcdsync/etcdsync/internal/testkit/etcdtest"
)

// serve sends one request to h and returns its status and the leader it names.
func serve(h http.Handler) (int, string, *httptest.ResponseRecorder) {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/work", nil))
	return w.Code, w.Header().Get(election.LeaderHeader), w
}

// awaitServe waits until h answers with code naming leader: the others learn of a change
// of leader from their watch, an event later.
func awaitServe(t *testing.T, h http.Handler, code int, leader string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, l, _ := serve(h)
		if c == code && l == leader {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handler answers %d naming %q, not %d naming %q within 30s", c, l, code, leader)
		}
		time.Sleep(10 * time.Millisecond) // a poll of an in-memory answer: no event to await
	}
}

// TestHandlerServesOnlyOnTheLeader: two candidates' handlers; the leader's serves, the
// other's answers 503 with Retry-After and the leader's value (percent-encoded where it is
// not a header's text), and the roles swap with the leadership; while nobody leads, no
// leader is named. An Election not made by New never serves; a nil next panics.
func TestHandlerServesOnlyOnTheLeader(t *testing.T) {
	t.Parallel()
	ctx := etcdtest.Context(t)
	const name = "handler-roles"
	served := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	a := newElection(t, cluster.Client(t), name)
	b := newElection(t, cluster.Client(t), name)
	ha, hb := a.Handler(served), b.Handler(served)

	code, leader, w := serve(hb)
	assert.Equal(t, http.StatusServiceUnavailable, code, "nobody leads")
	assert.Empty(t, leader, "nobody leads: no leader named")
	assert.Equal(t, "1", w.Header().Get("Retry-After"))

	const valueA = "http://a:8080/\n100%"
	require.NoError(t, a.Campaign(ctx, valueA))
	code, _, _ = serve(ha)
	assert.Equal(t, http.StatusTeapot, code, "the leader serves")
	awaitServe(t, hb, http.StatusServiceUnavailable, "http://a:8080/%0A100%25")
	got, err := url.PathUnescape("http://a:8080/%0A100%25")
	require.NoError(t, err)
	assert.Equal(t, valueA, got)

	bc := campaignAsync(ctx, b, "http://b:8080")
	etcdtest.Pending(t, bc, "b's campaign while a leads")
	require.NoError(t, a.Resign(ctx))
	require.NoError(t, etcdtest.Within(t, bc, 30*time.Second, "b's campaign"))
	code, _, _ = serve(hb)
	assert.Equal(t, http.StatusTeapot, code, "the new leader serves at once")
	awaitServe(t, ha, http.StatusServiceUnavailable, "http://b:8080")

	assert.PanicsWithValue(t, "election: Handler: nil next handler", func() { a.Handler(nil) })
	var unmade election.Election
	code, leader, _ = serve(unmade.Handler(served))
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Empty(t, leader)
	require.NoError(t, b.Resign(ctx))
	awaitServe(t, hb, http.StatusServiceUnavailable, "")
}

// TestHandlerOfALostLeadershipStopsServing: once the leader's key is gone (an operator
// deleted it), its handler turns requests away as soon as the loss is heard.
func TestHandlerOfALostLeadershipStopsServing(t *testing.T) {
	t.Parallel()
	ctx := etcdtest.Context(t)
	const name = "handler-lost"
	served := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	a := newElection(t, cluster.Client(t), name)
	require.NoError(t, a.Campaign(ctx, "a"))
	h := a.Handler(served)
	code, _, _ := serve(h)
	require.Equal(t, http.StatusOK, code)
	_, err := cluster.Client(t).Delete(ctx, a.Key())
	require.NoError(t, err)
	select {
	case <-a.Done():
	case <-ctx.Done():
		t.Fatal("the loss was not heard")
	}
	code, leader, _ := serve(h)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Empty(t, leader, "nobody leads")
}
