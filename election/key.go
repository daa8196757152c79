package election

// Key is the etcd key of this handle's leadership, the one IsOwner compares; "" without
// leadership.
func (e *Election) Key() string {
	if h := e.current(); h != nil {
		return h.Key()
	}
	return ""
}
