package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// NewConfigured starts one embedded member, in this process whatever ETCD_ENDPOINTS says,
// with the test configuration changed by configure (a server limit such as MaxTxnOps), and
// returns its client URL once it serves. tb's cleanup stops it and removes its data; a start
// that fails fails tb.
func NewConfigured(tb testing.TB, configure func(*embed.Config)) string {
	tb.Helper()
	for try := 1; ; try++ {
		endpoint, err := startConfigured(tb, configure)
		switch {
		case err == nil:
			return endpoint
		case try == portTries || !portTaken(err):
			tb.Fatalf("etcdtest: configured member: %v", err)
		}
	}
}

func startConfigured(tb testing.TB, configure func(*embed.Config)) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp("", "etcdtest-configured-")
	if err != nil {
		return "", fmt.Errorf("data dir: %w", err)
	}
	m := &member{
		name:          "m0",
		dir:           dir,
		clientURL:     url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])},
		peerListenURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])},
	}
	m.peerURL = m.peerListenURL
	m.initialCluster = m.name + "=" + m.peerURL.String()
	cfg := m.config()
	configure(cfg)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		tb.Cleanup(func() {
			shutdown(e, false)
			os.RemoveAll(dir)
		})
		return m.clientURL.String(), nil
	case err = <-e.Err():
	case <-e.Server.StopNotify():
		err = errors.New("server stopped")
	case <-timer.C:
		err = fmt.Errorf("not ready after %v", startTimeout)
	}
	shutdown(e, true)
	os.RemoveAll(dir)
	return "", err
}
