// Package etcdtest runs a real etcd for tests and examples: members embedded in this
// process, which tests may stop, kill and restart, or the external cluster named by
// ETCD_ENDPOINTS.
package etcdtest
