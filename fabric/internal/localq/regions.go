package localq

import (
	"sync"

	"github.com/exn-project/exn/fabric"
)

// Table is a NIC's region table: registered regions by NLA region index,
// each with its owner (the endpoint of one VPID) and size. Indices start
// at 1 and are never reused in a table's life, so a stale NLA cannot
// reach a later registration. The zero value is unusable; call Init.
type Table[O comparable, R any] struct {
	mu   sync.RWMutex
	next uint32 // last index handed out
	m    map[uint32]entry[O, R]
}

type entry[O comparable, R any] struct {
	r     R
	owner O
	size  uint64
}

// Init makes the table empty.
func (t *Table[O, R]) Init() { t.m = make(map[uint32]entry[O, R]) }

// Lock and Unlock take the table for writing, for the *Locked methods.
func (t *Table[O, R]) Lock()   { t.mu.Lock() }
func (t *Table[O, R]) Unlock() { t.mu.Unlock() }

// ReserveLocked hands out the next region index; false if the NLA's
// region field is exhausted (fabric.MaxRegions).
func (t *Table[O, R]) ReserveLocked() (uint32, bool) {
	if t.next >= fabric.MaxRegions {
		return 0, false
	}
	t.next++
	return t.next, true
}

// BumpLocked hands out the next index without the exhaustion check, for
// keys that share the counter but are not regions.
func (t *Table[O, R]) BumpLocked() uint32 {
	t.next++
	return t.next
}

// PutLocked publishes r under idx for owner.
func (t *Table[O, R]) PutLocked(idx uint32, owner O, r R, size uint64) {
	t.m[idx] = entry[O, R]{r: r, owner: owner, size: size}
}

// LookupLocked returns the region with index idx, if any.
func (t *Table[O, R]) LookupLocked(idx uint32) (R, bool) {
	e, ok := t.m[idx]
	return e.r, ok
}

// Lookup returns the region with index idx, if any.
func (t *Table[O, R]) Lookup(idx uint32) (R, bool) {
	t.mu.RLock()
	e, ok := t.m[idx]
	t.mu.RUnlock()
	return e.r, ok
}

// Check resolves [nla, nla+length) in a region of owner: NErrAccess if
// nla's region is not registered to owner, NErrBounds if the range runs
// past its end (fabric.CheckRange).
func (t *Table[O, R]) Check(owner O, nla fabric.NLA, length uint64) (R, fabric.NotifyErr) {
	t.mu.RLock()
	e, ok := t.m[nla.Region()]
	t.mu.RUnlock()
	var zero R
	if !ok || e.owner != owner {
		return zero, fabric.NErrAccess
	}
	if !fabric.CheckRange(nla, length, e.size) {
		return zero, fabric.NErrBounds
	}
	return e.r, fabric.NErrNone
}

// Remove unpublishes the region whose base NLA is base, if owner owns it.
func (t *Table[O, R]) Remove(owner O, base fabric.NLA) (R, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := base.Region()
	e, ok := t.m[idx]
	if !ok || e.owner != owner || base.Offset() != 0 {
		var zero R
		return zero, false
	}
	delete(t.m, idx)
	return e.r, true
}

// RemoveOwner unpublishes every region of owner and returns them.
func (t *Table[O, R]) RemoveOwner(owner O) []R {
	t.mu.Lock()
	defer t.mu.Unlock()
	var rs []R
	for idx, e := range t.m {
		if e.owner == owner {
			delete(t.m, idx)
			rs = append(rs, e.r)
		}
	}
	return rs
}
