// Package misusetest proves, in its tests alone, that every public call of the etcdsync
// packages holds up under careless and unlucky use: a zero value or a nil handle, a nil or
// typed-nil Locker, a TTL past etcd's limit, a context already done or ending mid-call, a
// client closed under the handle, and concurrent calls on one handle. Each call returns at
// once with the error its doc comment names; none blocks, none panics, none writes.
//
// One table of every exported method of every handle type (surface_test.go) drives the
// shared cases; the tests beside it pin the cases of one primitive each.
package misusetest
