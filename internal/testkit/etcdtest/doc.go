// Package etcdtest runs a real etcd for tests and examples: members embedded in this
// process, which tests may stop, kill and restart, and, started WithPeerProxies, partition
// from their peers through etcd's own fault proxy (Proxy, go.etcd.io/etcd/pkg/v3/proxy);
// or the external cluster named by ETCD_ENDPOINTS.
package etcdtest
