package localq

import (
	"sync"
	"sync/atomic"

	"github.com/exn-project/exn/fabric"
)

// Mailbox is a VPID's bounded VELO receive ring, as mem and fabnet keep
// it: messages are copied in by the sender (PutLocked) and out by Recv
// (TakeLocked), so a message never aliases the caller's buffer. Senders
// that find no room park on Space, which the consumer closes when it
// frees slots (WakeLocked). Back-pressure (how much room a sender may
// use) is the backend's: it compares N with Cap itself.
//
// Locking: Mu guards everything but the length mirror; the *Locked
// methods need it held. Len reads the mirror without it. The zero value
// is unusable; call Init.
type Mailbox struct {
	Mu     sync.Mutex
	ring   []fabric.Message
	head   int // next slot to read
	n      int // messages queued
	closed bool
	space  chan struct{} // non-nil while a sender waits for room
	length atomic.Int32  // mirror of n for lock-free readiness checks
}

// Init sizes the ring to slots messages.
func (mb *Mailbox) Init(slots int) { mb.ring = make([]fabric.Message, slots) }

// Length is the lock-free mirror of the queued count, for Core.Init.
func (mb *Mailbox) Length() *atomic.Int32 { return &mb.length }

// Cap returns the ring size.
func (mb *Mailbox) Cap() int { return len(mb.ring) }

// NLocked returns the number of queued messages.
func (mb *Mailbox) NLocked() int { return mb.n }

// ClosedLocked reports whether CloseLocked ran.
func (mb *Mailbox) ClosedLocked() bool { return mb.closed }

// PutLocked appends a copy of m from src; the caller checked room.
func (mb *Mailbox) PutLocked(src fabric.Addr, m *fabric.Message) {
	s := &mb.ring[(mb.head+mb.n)%len(mb.ring)]
	s.Peer, s.MC, s.Tag, s.Len = src, m.MC, m.Tag, m.Len
	copy(s.Data[:m.Len], m.Data[:m.Len])
	mb.n++
	mb.length.Store(int32(mb.n))
}

// TakeLocked copies up to len(msgs) messages out, oldest first, and frees
// their slots; it returns how many and their bytes. The caller wakes
// senders (WakeLocked) if k > 0.
func (mb *Mailbox) TakeLocked(msgs []fabric.Message) (k int, bytes uint64) {
	k = min(len(msgs), mb.n)
	for i := 0; i < k; i++ {
		s := &mb.ring[mb.head]
		d := &msgs[i]
		d.Peer, d.MC, d.Tag, d.Len = s.Peer, s.MC, s.Tag, s.Len
		copy(d.Data[:s.Len], s.Data[:s.Len])
		bytes += uint64(s.Len)
		if mb.head++; mb.head == len(mb.ring) {
			mb.head = 0
		}
	}
	mb.n -= k
	mb.length.Store(int32(mb.n))
	return k, bytes
}

// SpaceLocked returns the channel a sender waiting for room parks on
// (made on first use: no channel while nobody waits).
func (mb *Mailbox) SpaceLocked() <-chan struct{} {
	if mb.space == nil {
		mb.space = make(chan struct{})
	}
	return mb.space
}

// WakeLocked wakes every sender parked on SpaceLocked's channel.
func (mb *Mailbox) WakeLocked() {
	if mb.space != nil {
		close(mb.space)
		mb.space = nil
	}
}

// CloseLocked empties the mailbox for good and wakes parked senders (they
// then see ClosedLocked).
func (mb *Mailbox) CloseLocked() {
	mb.closed = true
	mb.n = 0
	mb.length.Store(0)
	mb.WakeLocked()
}
