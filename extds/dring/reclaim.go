package dring

// Giving an idle ring's pages back (docs/direct.md, "Rings that shrink
// when idle"). A buffer file is sparse: a ring's pages exist once
// written, and until now stayed until the connection ended, so a
// connection that once streamed held 2 MiB of /dev/shm for life. exnd
// (extds/shimsrv/reclaim.go) calls ReclaimTx for a direction that moved
// no byte for a while; the pages come back, one fault each, with the
// next bytes.
//
// Why under the producer lock: the consumer may free slots it consumed
// only before it publishes head (from then on a producer may write
// them), so an empty ring's slots are safe only while no producer can
// write: ReclaimTx takes prod_lock with the value lockReclaim (a CAS from
// free, never a wait), checks that the ring is empty, punches the
// direction's data out and lets go, waking every waiter. A producer that
// meets lockReclaim waits on the futex, a non-blocking one too
// (shim/dring.c lk_acquire): the hold is one madvise, and EAGAIN on an
// empty ring would leave an edge-triggered epoll without the edge it
// waits for (the space was there all along). Consumers need no lock:
// with tail == head and no producer they read nothing.

import (
	"math"

	"github.com/exn-project/exn/internal/sys"
)

// lockReclaim is prod_lock's value while ReclaimTx holds it
// (shim/dring.h, EXDD_LOCK_RECLAIM).
const lockReclaim = 3

// ReclaimTx frees the pages of the direction this side writes if it is
// empty and no producer holds its lock: true if it did. It never waits:
// a held lock or unread bytes return false, as does a closed Endpoint.
// Across hosts only a ring whose bytes a PUT reads by address may be
// punched (a NIC that pins a registered buffer keeps reading the old
// pages): the caller decides. Safe for concurrent use.
func (e *Endpoint) ReclaimTx() (freed bool, err error) {
	e.whileOpen(func() {
		c := e.tx
		if !c.prodLock.CompareAndSwap(0, lockReclaim) {
			return
		}
		defer func() {
			c.prodLock.Store(0)
			_, _ = sys.FutexWake(c.prodLock, math.MaxInt32)
		}()
		if c.tail.Load() != c.head.Load() {
			return
		}
		if err = sys.RemovePages(e.txData); err == nil {
			freed = true
		}
	})
	return freed, err
}

// TxCursor is the bytes ever written into the direction this side
// writes (its tail): a reclaimer that sees it unchanged for a while
// knows the direction is idle. 0 once closed.
func (e *Endpoint) TxCursor() (tail uint64) {
	e.whileOpen(func() { tail = e.tx.tail.Load() })
	return tail
}

// TxResident is how many pages of the direction this side writes exist
// now (sys.ResidentPages): what a reclaim would give back. -1 once
// closed.
func (e *Endpoint) TxResident() (pages int, err error) {
	pages = -1
	e.whileOpen(func() { pages, err = sys.ResidentPages(e.txData) })
	return pages, err
}
