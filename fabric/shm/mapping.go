package shm

import (
	"sync/atomic"

	"github.com/exn-project/exn/internal/sys"
)

// mapping is a reference-counted shared mapping. The cache that creates it
// holds one reference; every user acquires one for the duration of a
// copy, so an unmap (peer death, Deregister, a stale generation) never
// pulls memory out from under a running copy. The mapping is unmapped when
// the last reference goes.
type mapping struct {
	b    []byte
	refs atomic.Int64
	// bell is 1 + the descriptor a producer opened on the mapped VPID's
	// doorbell FIFO (0: none), cached with the mapping and closed with it.
	// Rings hold a reference, so it is never closed under a write.
	bell atomic.Int32
}

func newMapping(b []byte) *mapping {
	m := &mapping{b: b}
	m.refs.Store(1)
	return m
}

// acquire takes a reference unless the mapping is already released.
func (m *mapping) acquire() bool {
	for {
		r := m.refs.Load()
		if r <= 0 {
			return false
		}
		if m.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// release drops a reference and unmaps on the last one.
func (m *mapping) release() {
	if m.refs.Add(-1) == 0 {
		sys.Unmap(m.b) //nolint:errcheck // munmap of our own mapping cannot fail
		if fd := m.bell.Swap(0); fd > 0 {
			sys.CloseFD(int(fd - 1)) //nolint:errcheck // nothing to do about it
		}
	}
}
