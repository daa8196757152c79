//go:build unix

package main

import (
	"context"
	"errors"
	"flag"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	nswatch "github.com/etcdsync/etcdsync/internal/namespace"
	"go.uber.org/zap"

	"github.com/etcdsync/etcdsync/internal/core"
)

// connection holds the flags that say how to reach etcd, named as etcdctl names them, so
// that an etcdctl set-up (its flags or its ETCDCTL_* environment) works as it is.
type connection struct {
	endpoints          string
	dialTimeout        time.Duration
	commandTimeout     time.Duration
	cacert, cert, key  string
	user, password     string
	insecureSkipVerify bool
	namespace          string
}

// register adds the connection flags to fs.
func (c *connection) register(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoints, "endpoints", "127.0.0.1:2379", "etcd's client `URLs`, comma-separated ($ETCDCTL_ENDPOINTS)")
	fs.DurationVar(&c.dialTimeout, "dial-timeout", 2*time.Second, "how long to try to reach etcd at start ($ETCDCTL_DIAL_TIMEOUT)")
	fs.DurationVar(&c.commandTimeout, "command-timeout", 5*time.Second, "bound of each request that does not wait its turn: a release, a status read ($ETCDCTL_COMMAND_TIMEOUT)")
	fs.StringVar(&c.cacert, "cacert", "", "verify etcd's certificate with this CA `file` ($ETCDCTL_CACERT)")
	fs.StringVar(&c.cert, "cert", "", "present this client certificate `file` ($ETCDCTL_CERT)")
	fs.StringVar(&c.key, "key", "", "the private key `file` of --cert ($ETCDCTL_KEY)")
	fs.StringVar(&c.user, "user", "", "log in as `user[:password]` ($ETCDCTL_USER)")
	fs.StringVar(&c.password, "password", "", "the password of --user, if not given there ($ETCDCTL_PASSWORD)")
	fs.BoolVar(&c.insecureSkipVerify, "insecure-skip-tls-verify", false, "do not verify etcd's certificate ($ETCDCTL_INSECURE_SKIP_TLS_VERIFY)")
	fs.StringVar(&c.namespace, "namespace", "", "work inside this key `prefix`, as a program whose client etcd's namespace package wraps, or behind grpc-proxy --namespace; keys are shown without it ($ETCDSYNC_NAMESPACE)")
}

// connectionFlags are the flags that take their default from an environment variable
// (envName).
var connectionFlags = []string{
	"endpoints", "dial-timeout", "command-timeout", "cacert", "cert", "key", "user", "password",
	"insecure-skip-tls-verify", "namespace",
}

// envName is the environment variable of flag: ETCDCTL_ and its name in capitals, '-' as
// '_', as etcdctl names it; ETCDSYNC_NAMESPACE for --namespace, which etcdctl lacks.
func envName(flag string) string {
	if flag == "namespace" {
		return "ETCDSYNC_NAMESPACE"
	}
	return "ETCDCTL_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every connection flag that the command line did not set from its ETCDCTL_*
// variable, if that is set and not empty: as with etcdctl, a flag overrides its variable.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	set := setFlags(fs)
	for _, name := range connectionFlags {
		v := getenv(envName(name))
		if set[name] || v == "" {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return usagef("%s=%s is not a valid --%s: %s", envName(name), quoteValue(v), name, valueProblem(fs.Lookup(name), v, err.Error()))
		}
	}
	return nil
}

// config is the client configuration the flags describe.
func (c *connection) config() (clientv3.Config, error) {
	cfg := clientv3.Config{
		DialTimeout: c.dialTimeout,
		Logger:      zap.NewNop(),
	}
	for ep := range strings.SplitSeq(c.endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			cfg.Endpoints = append(cfg.Endpoints, ep)
		}
	}
	switch {
	case len(cfg.Endpoints) == 0:
		return cfg, usagef("--endpoints names no endpoint")
	case c.dialTimeout <= 0:
		return cfg, usagef("--dial-timeout %v is not positive", c.dialTimeout)
	case c.commandTimeout <= 0:
		return cfg, usagef("--command-timeout %v is not positive", c.commandTimeout)
	case (c.cert == "") != (c.key == ""):
		return cfg, usagef("--cert and --key go together")
	}
	if c.user != "" {
		name, password, hasPassword := strings.Cut(c.user, ":")
		if !hasPassword {
			password = c.password
		}
		if name == "" || password == "" {
			return cfg, usagef("--user %q needs a name and a password (user:password, --password or $ETCDCTL_PASSWORD)", name)
		}
		cfg.Username, cfg.Password = name, password
	}
	secure := c.cacert != "" || c.cert != "" || c.insecureSkipVerify
	for _, ep := range cfg.Endpoints {
		secure = secure || strings.HasPrefix(ep, "https://") || strings.HasPrefix(ep, "unixs://")
	}
	if secure {
		info := transport.TLSInfo{CertFile: c.cert, KeyFile: c.key, TrustedCAFile: c.cacert, InsecureSkipVerify: c.insecureSkipVerify}
		tlsCfg, err := info.ClientConfig()
		if err != nil {
			return cfg, usagef("TLS: %v", err)
		}
		cfg.TLS = tlsCfg
	}
	return cfg, nil
}

// open opens a client. It does no I/O, unless --user asks it to log in.
func (c *connection) open() (*clientv3.Client, error) {
	cfg, err := c.config()
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, failf(exitEtcd, "etcd at %s: %v", c.endpoints, err)
	}
	if c.namespace != "" {
		cli.KV = namespace.NewKV(cli.KV, c.namespace)
		cli.Watcher = nswatch.NewWatcher(cli.Watcher, c.namespace)
		cli.Lease = namespace.NewLease(cli.Lease, c.namespace)
	}
	return cli, nil
}

// request opens a client for a command that sends a few requests, all within
// --command-timeout: close closes the client and ends ctx.
func (c *connection) request() (cli *clientv3.Client, ctx context.Context, close func(), err error) {
	if cli, err = c.open(); err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.commandTimeout)
	return cli, ctx, func() { cancel(); cli.Close() }, nil
}

// validNames refuses, as a usage error, the first name the primitives would.
func validNames(names []string) error {
	for _, n := range names {
		if err := core.ValidateName(n); err != nil {
			return usagef("%v", err)
		}
	}
	return nil
}

// probe makes sure etcd answers within --dial-timeout, with one Range that counts the keys
// under prefix (one the user may read), so that an unreachable etcd or a refused login or
// permission fails now, with exit 69, rather than as a wait that never ends. With several
// endpoints it asks each for its cluster's ID too (a Status each): endpoints of different
// clusters would take a lease from one and a key from the other.
func (c *connection) probe(cli *clientv3.Client, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.dialTimeout)
	defer cancel()
	_, err := cli.Get(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return failf(exitEtcd, "no answer from etcd at %s within %v", c.endpoints, c.dialTimeout)
	case err != nil:
		return failf(exitEtcd, "etcd at %s: read %s: %v", c.endpoints, prefix, err)
	}
	if len(cli.Endpoints()) > 1 {
		if err := core.OneCluster(ctx, cli); err != nil {
			return fail(exitEtcd, err)
		}
	}
	return nil
}
