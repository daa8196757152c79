package election

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LeaderHeader is the header in which [Election.Handler] names the leader to a request
// that this process does not serve.
const LeaderHeader = "Etcdsync-Leader"

// Handler returns a handler that serves each request with next while this handle leads
// (Err is nil), and answers every other one 503 Service Unavailable, with "Retry-After: 1"
// and, while another candidate leads, that leader's value in the header [LeaderHeader]
// (callers may redirect on it; absent while nobody leads). The value is sent as it is,
// but for '%', control bytes and bytes above 0x7E, which are percent-encoded, so that
// url.PathUnescape gives it back whatever it holds.
//
// Leadership is not readiness: a readiness probe that fails on the candidates takes them
// out of service, and a rolling update then waits on them; keep the probe about whether the
// process can serve at all, and let Handler send callers to the leader (see the Handler
// example).
//
// A nil next panics, as http.Handle does.
//
// Cost: none of its own while this handle leads (a check of the leadership in memory).
// The first request it turns away starts an [Election.Observe] of the name on the client's
// context (one watch shared with the client's other observers, ended by the client's
// Close) and waits up to a second for its first read; later ones read what it last heard,
// with no I/O of their own.
func (e *Election) Handler(next http.Handler) http.Handler {
	if next == nil {
		panic("election: Handler: nil next handler") // as http.Handle does: a program's bug
	}
	return &leaderHandler{e: e, next: next}
}

type leaderHandler struct {
	e      *Election
	next   http.Handler
	follow sync.Once
	heard  chan struct{}          // closed once Observe yielded the first leader, or ended
	leader atomic.Pointer[Leader] // the last leader Observe yielded; nil before the first
}

// firstLeaderWait bounds how long a request turned away waits for the first leader that
// the Observe it started reads, before it is answered without naming one.
const firstLeaderWait = time.Second

func (h *leaderHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.e.Err() == nil { // leads (nil only while this handle holds the leadership)
		h.next.ServeHTTP(w, r)
		return
	}
	h.follow.Do(h.observe)
	select {
	case <-h.heard:
	case <-r.Context().Done():
	case <-time.After(firstLeaderWait):
	}
	if l := h.leader.Load(); l != nil && l.Token != 0 && l.Token != h.e.Token() {
		w.Header().Set(LeaderHeader, headerValue(l.Value))
	}
	w.Header().Set("Retry-After", "1")
	http.Error(w, "not the leader", http.StatusServiceUnavailable)
}

// observe follows the leader until the client is closed.
func (h *leaderHandler) observe() {
	h.heard = make(chan struct{})
	if h.e.shell().Check("serve") != nil {
		close(h.heard) // nothing to follow: no leader is ever named
		return
	}
	leaders := h.e.Observe(h.e.s.Q.Client().Ctx())
	go func() {
		var heard sync.Once
		defer heard.Do(func() { close(h.heard) })
		for l := range leaders {
			h.leader.Store(&l)
			heard.Do(func() { close(h.heard) })
		}
	}()
}

// headerValue is v with '%', control bytes and bytes above 0x7E percent-encoded: a valid
// header value that url.PathUnescape turns back into v.
func headerValue(v string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '%' || c < 0x20 || c > 0x7E {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
