// Package trylock acquires etcdsync locks without queueing: one try ([Once]), tries spaced by
// a jittered exponential backoff ([Retry]), or tries for at most a duration ([Timeout]).
//
// A try never waits in line and never writes when it fails: a failed try of a mutex,
// rwmutex, reentrant or semaphore is one Txn that finds the name busy and leaves nothing in
// etcd. That makes tries the right tool where a Lock would be wrong: a cron job that should
// skip its run while another instance has it, a request that should fail fast rather than
// wait behind a queue. Unlike Lock, retries are not fair: a later arrival may win, and
// nobody keeps a place in line.
//
// Between tries Retry does not only sleep: for a Locker that implements [ReleaseWatcher]
// (every etcdsync primitive, through the adapters here where needed), a release on the name
// ends the wait early, so a lock that comes free is tried again at once, whatever the
// backoff.
//
// *mutex.Mutex, *mutex.Multi and *rwmutex.RWMutex (its write side) are Lockers as they are.
// [RLocker], [Reentrant], [Permits] and [PermitsN] adapt the read side of an RWMutex, a
// reentrant.Mutex (handing the owning context back) and a semaphore (handing the permit
// back).
//
// See Example for a job that runs only where it gets the lock, and examples/trylock for a
// program.
package trylock
