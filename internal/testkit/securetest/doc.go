// Package securetest proves, in its tests alone, that every etcdsync primitive (mutex, both
// sides of rwmutex, reentrant, semaphore, trylock over a mutex, election) works on a secured
// etcd as it does on an open one: over TLS with client-certificate authentication; for a user
// whose role grants one key prefix, through WithPrefix, with any request outside the grant
// refused at once with etcd's permission-denied error and nothing left behind; and through a
// client whose KV, Watcher and Lease are confined to a namespace, where the keys land under
// the namespace and meet those of a plain client using WithPrefix of it.
package securetest
