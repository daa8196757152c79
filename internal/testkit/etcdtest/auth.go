package etcdtest

import (
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"slices"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Grants says, for each user, the key prefixes it may read and write: {"app": {"app/"}}.
// The empty prefix stands for the whole keyspace.
type Grants map[string][]string

// EnableAuth turns on etcd's authentication and role-based access control, once: it creates
// user root with role root (every permission), and for each user of grants a role of the
// same name that may read and write (READWRITE) every key under each of its prefixes, granted
// to that user alone; then it enables auth. Every later request needs a user.
//
// On a WithTLS cluster users have no password: etcd takes the CommonName of the client
// certificate as the user (ClientAs), and ClientConfig's is root's. Without TLS each user
// gets a random password, ClientWithPassword logs in with it, and ClientConfig logs in as
// root from then on. Grants may not name root.
func (c *Cluster) EnableAuth(ctx context.Context, grants Grants) error {
	if _, ok := grants[RootUser]; ok {
		return fmt.Errorf("etcdtest: enable auth: %s has every permission, it takes no grant", RootUser)
	}
	cli, err := c.NewClient()
	if err != nil {
		return err
	}
	defer cli.Close()
	passwords := map[string]string{}
	if err := c.addUser(ctx, cli, RootUser, passwords); err != nil {
		return err
	}
	// root's role exists without being added; etcd refuses to enable auth unless root has it.
	if _, err := cli.UserGrantRole(ctx, RootUser, RootUser); err != nil {
		return fmt.Errorf("etcdtest: grant role %s: %w", RootUser, err)
	}
	for _, user := range slices.Sorted(maps.Keys(grants)) {
		if err := c.addUser(ctx, cli, user, passwords); err != nil {
			return err
		}
		if err := grantPrefixes(ctx, cli, user, grants[user]); err != nil {
			return err
		}
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcdtest: enable auth: %w", err)
	}
	if c.ca == nil {
		c.auth.Lock()
		c.passwords = passwords
		c.auth.Unlock()
	}
	return nil
}

// addUser creates user: with no password on a WithTLS cluster, else with a random one, which
// it adds to passwords.
func (c *Cluster) addUser(ctx context.Context, cli *clientv3.Client, user string, passwords map[string]string) error {
	opts := &clientv3.UserAddOptions{NoPassword: c.ca != nil}
	var pw string
	if !opts.NoPassword {
		pw = rand.Text()
		passwords[user] = pw
	}
	if _, err := cli.UserAddWithOptions(ctx, user, pw, opts); err != nil {
		return fmt.Errorf("etcdtest: add user %s: %w", user, err)
	}
	return nil
}

// grantPrefixes gives user a role of its own name that may read and write every key under
// each of prefixes.
func grantPrefixes(ctx context.Context, cli *clientv3.Client, user string, prefixes []string) error {
	if _, err := cli.RoleAdd(ctx, user); err != nil {
		return fmt.Errorf("etcdtest: add role %s: %w", user, err)
	}
	for _, prefix := range prefixes {
		key, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
		if prefix == "" {
			key = "\x00" // with the range end "\x00": every key
		}
		if _, err := cli.RoleGrantPermission(ctx, user, key, end, clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			return fmt.Errorf("etcdtest: grant %s read and write on %q: %w", user, prefix, err)
		}
	}
	if _, err := cli.UserGrantRole(ctx, user, user); err != nil {
		return fmt.Errorf("etcdtest: grant role %s: %w", user, err)
	}
	return nil
}

// ClientWithPassword opens a client that logs in as user with the password EnableAuth gave
// it, on a cluster without TLS, and closes it in tb.Cleanup; it fails tb if the user has no
// password (a WithTLS cluster: see ClientAs) or the client cannot be opened.
func (c *Cluster) ClientWithPassword(tb testing.TB, user string) *clientv3.Client {
	tb.Helper()
	cfg, err := c.ConfigFor(user)
	if err != nil {
		tb.Fatal(err)
	}
	return clientOfConfig(tb, cfg)
}

// ConfigFor is ClientConfig for a client that logs in as user with the password EnableAuth
// gave it, on a cluster without TLS; an error if the user has no password (a WithTLS
// cluster: see ClientAs).
func (c *Cluster) ConfigFor(user string) (clientv3.Config, error) {
	c.auth.Lock()
	pw, ok := c.passwords[user]
	c.auth.Unlock()
	if !ok {
		return clientv3.Config{}, fmt.Errorf("etcdtest: user %q has no password: EnableAuth gives passwords on a cluster without TLS only", user)
	}
	cfg := c.ClientConfig()
	cfg.Username, cfg.Password = user, pw
	return cfg, nil
}
