package localq

import (
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

// PushResult says what Push did with a notification.
type PushResult uint8

const (
	// Queued: the notification is in the queue; signal the consumer.
	Queued PushResult = iota
	// Full: the queue was full; it was dropped and NotifyOverflow counted.
	Full
	// Dropped: the queue is closed; it was dropped silently.
	Dropped
)

// NotifyQueue is a VPID's bounded notification queue. The zero value is
// unusable; call Init.
type NotifyQueue struct {
	mu     sync.Mutex
	ring   []fabric.Notification
	head   int
	n      int
	closed bool
	length atomic.Int32 // mirror of n for lock-free readiness checks
}

// Init sizes the queue to depth entries.
func (q *NotifyQueue) Init(depth int) { q.ring = make([]fabric.Notification, depth) }

// Cap returns the queue depth.
func (q *NotifyQueue) Cap() int { return len(q.ring) }

// Len returns the number of queued notifications without locking.
func (q *NotifyQueue) Len() int32 { return q.length.Load() }

// Push queues nt. It never blocks. A full queue drops nt and counts
// ctr.NotifyOverflow; a queued one counts Notifications (and NotifyErrors
// for an error notification).
func (q *NotifyQueue) Push(ctr *fabric.Counters, nt fabric.Notification) PushResult {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return Dropped
	}
	if q.n == len(q.ring) {
		q.mu.Unlock()
		ctr.NotifyOverflow.Add(1)
		return Full
	}
	q.ring[(q.head+q.n)%len(q.ring)] = nt
	q.n++
	q.length.Store(int32(q.n))
	q.mu.Unlock()
	ctr.Notifications[nt.Kind].Add(1)
	if nt.Err != fabric.NErrNone {
		ctr.NotifyErrors[nt.Err].Add(1)
	}
	return Queued
}

// Poll copies up to len(ns) notifications, oldest first, and removes them.
// It never blocks. ok is false if the queue is closed.
func (q *NotifyQueue) Poll(ns []fabric.Notification) (k int, ok bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, false
	}
	k = min(len(ns), q.n)
	for i := 0; i < k; i++ {
		ns[i] = q.ring[q.head]
		if q.head++; q.head == len(q.ring) {
			q.head = 0
		}
	}
	q.n -= k
	q.length.Store(int32(q.n))
	q.mu.Unlock()
	return k, true
}

// Close empties the queue; later Pushes are dropped and Polls fail.
func (q *NotifyQueue) Close() {
	q.mu.Lock()
	q.closed = true
	q.n = 0
	q.length.Store(0)
	q.mu.Unlock()
}
