package semaphore

// Key is the permit's key in etcd, "<name>/permit/<lease hex>_<n>" under the name's prefix
// for a permit of one unit, "<name>/permit/u<units>/<lease hex>_<n>" for one of more;
// "" once released, and for a nil or zero Permit.
func (p *Permit) Key() string {
	if h := p.hold(); h != nil {
		return h.Key()
	}
	return ""
}
