package rwmutex

// Key is the etcd key of this handle's current hold, the one Done follows: the write hold's
// key if it has one, else its newest read hold's (shared by the readers of a group); ""
// without a hold.
func (rw *RWMutex) Key() string {
	if h := rw.current(); h != nil {
		return h.Key()
	}
	return ""
}
