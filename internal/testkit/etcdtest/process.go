package etcdtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"
)

// ServerBinary is the etcd server that NewProcesses runs: $ETCDTEST_ETCD, or etcd on PATH;
// "" if there is none.
func ServerBinary() string {
	if bin := os.Getenv("ETCDTEST_ETCD"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return ""
	}
	return bin
}

// NewProcesses starts size members as etcd server processes of bin (see ServerBinary) on
// loopback, with fsync as etcd does by default, and returns once they serve and agree on a
// leader. Stop sends a member SIGTERM (etcd hands leadership over first, as under systemd),
// Kill sends SIGKILL, Restart starts it again on its data; Backup and RestoreBackup work on
// a stopped member's data dir. Partitions are for embedded members only. On error nothing is
// left running. Of opts, only WithAuthTokenTTL and WithJWT apply.
func NewProcesses(size int, bin string, opts ...Option) (*Cluster, error) {
	if size < 1 || bin == "" {
		return nil, fmt.Errorf("etcdtest: %d members of %q", size, bin)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	for try := 1; ; try++ {
		c, err := newProcesses(size, bin, o)
		if err == nil || try == portTries {
			return c, err
		}
	}
}

func newProcesses(size int, bin string, o options) (*Cluster, error) {
	ports, err := freePorts(2 * size)
	if err != nil {
		return nil, err
	}
	token := make([]byte, 6)
	_, _ = rand.Read(token)
	c := &Cluster{members: make([]*member, size), processes: true}
	authToken := ""
	if o.jwt {
		if authToken, err = c.makeJWTKey(); err != nil {
			c.Close()
			return nil, err
		}
	}
	initial := make([]string, size)
	for i := range c.members {
		dir, err := os.MkdirTemp("", fmt.Sprintf("etcdtest-p%d-", i))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("etcdtest: data dir: %w", err)
		}
		m := &member{
			name:          fmt.Sprintf("m%d", i),
			dir:           dir + "/data",
			logFile:       dir + "/etcd.log",
			bin:           bin,
			token:         "etcdtest-" + hex.EncodeToString(token),
			clientURL:     url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])},
			peerListenURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])},
			authTokenTTL:  o.authTokenTTL,
			authToken:     authToken,
		}
		m.peerURL = m.peerListenURL
		c.members[i] = m
		c.endpoints = append(c.endpoints, m.clientURL.String())
		initial[i] = m.name + "=" + m.peerURL.String()
	}
	if err := c.startNew(initial); err != nil {
		return nil, err
	}
	return c, nil
}

// process is a running member's server process.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once it has exited and been waited for
}

// startProcess starts the member's server and returns once it reports itself healthy (it
// has a leader), or with an error (and nothing left running) after startTimeout. Under
// m.life.
func (m *member) startProcess() error {
	state := "new"
	if m.joined {
		state = "existing" // ignored anyway once the data dir holds a WAL
	}
	logf, err := os.OpenFile(m.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	}
	defer logf.Close()
	cmd := exec.Command(m.bin,
		"--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", m.clientURL.String(), "--advertise-client-urls", m.clientURL.String(),
		"--listen-peer-urls", m.peerListenURL.String(), "--initial-advertise-peer-urls", m.peerURL.String(),
		"--initial-cluster", m.initialCluster, "--initial-cluster-state", state,
		"--initial-cluster-token", m.token)
	if m.authToken != "" {
		cmd.Args = append(cmd.Args, "--auth-token", m.authToken)
	}
	if m.authTokenTTL > 0 {
		cmd.Args = append(cmd.Args, "--auth-token-ttl", strconv.FormatUint(uint64(m.authTokenTTL), 10))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.name, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	m.joined = true
	deadline := time.Now().Add(startTimeout)
	for {
		if healthy(m.clientURL) {
			m.proc = p
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("etcdtest: start %s: it exited (%v); see %s", m.name, cmd.ProcessState, m.logFile)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.signal(syscall.SIGKILL)
			return fmt.Errorf("etcdtest: start %s: not healthy after %v; see %s", m.name, startTimeout, m.logFile)
		}
	}
}

// healthClient keeps no connection open: nothing of it outlives a check (goleak).
var healthClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// healthy reports whether the member at u says it is healthy: it serves and has a leader.
func healthy(u url.URL) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String()+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := healthClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// signal sends sig and waits for the process to exit; after SIGTERM, it sends SIGKILL if it
// has not exited within 30 s.
func (p *process) signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
		return
	case <-time.After(30 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}
