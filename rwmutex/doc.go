// Package rwmutex is a distributed readers/writer lock on etcd: many readers at once or one
// writer, granted in the order of the keys' create revisions, so that a reader who comes
// after a waiting writer waits behind it and writers never starve.
//
// Readers write keys "<name>/read/<lease hex>_<n>" and writers "<name>/write/<lease hex>_<n>",
// bound to the lease that the primitives on the client share (see package etcdsync, which
// also holds the options and errors). For a name without '/' and '%' that is the layout of
// etcd's recipe.RWMutex (go.etcd.io/etcd/client/v3/experimental/recipes), so its readers and
// writers and ours take turns on the same name; other names are escaped, so that "a", "a/b"
// and "ab" never meet.
//
// A hold may change in place, keeping its key, its place in line and its create revision:
// [RWMutex.Downgrade] turns the write hold into a read hold, with no writer in between;
// [RWMutex.ULock] takes an upgradable read (one per name, beside readers, never beside a
// writer), which [RWMutex.Upgrade] turns into the write hold once the readers admitted
// before it have left. Both are write keys whose value ends with " mode=read" or
// " mode=upgradable": etcdsync of older versions takes them for writers, which is safe,
// and so does etcd's recipe.RWMutex, which weighs only keys whose mod revision is below its
// own key's creation: a change in place is refused ([ErrInvalidOption]) while a waiter of
// the recipe is queued behind the hold, which would not see the change.
//
// The readers of one [RWMutex] share a single read key: one etcd write to enter and one to
// leave for the whole group, however many join it. A group takes no new members once a
// writer has queued behind it, so a stream of local readers cannot starve a writer.
//
// A lock is not a fence: a writer that pauses (GC, swap, a stopped VM) may wake after its
// lease expired and another holder came in. Guard every write the lock protects with
// [RWMutex.IsOwner] in the same Txn, or with [RWMutex.Token] where the storage can compare
// tokens. Readers have no fence; a reader that must not act on stale data re-reads it in
// etcd.
//
// See Example, and examples/config for a program.
package rwmutex
