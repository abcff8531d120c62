package shm

// Ring protocol.
//
// A VPID file holds two bounded multi-producer, single-consumer rings in
// the style of Vyukov's bounded queue: a VELO mailbox of 128-byte slots and
// a notification queue of 32-byte entries. Producers are any process that
// maps the file; the consumer is the owning endpoint (one process, and
// inside it the endpoint's recvMu or pollMu).
//
// Stages, per message:
//
//  1. Claim: a producer loads the shared tail, and if the slot at tail&mask
//     says "free for position tail", CASes tail to tail+1. If the slot
//     still holds an older position, the ring is full.
//  2. Mark: the producer stores "claimed by node N, position tail" into the
//     status word, so a consumer can tell whose death wedged a slot.
//  3. Fill: the producer copies the payload with plain stores.
//  4. Publish: the producer stores the status word LAST, with an atomic
//     (sequentially consistent, hence release) store: the descriptor with
//     the source filled in, and the sequence "published for position p"
//     (p+1) in bits 40..63.
//  5. Consume: the consumer, which alone owns head, loads the status word
//     (acquire), and if it says "published for head", decodes the
//     descriptor, copies the payload out, then frees the slot by storing
//     "free for head+slots" — again last, atomically — and advances head.
//
// The mailbox sequence lives in the top 23 of the 24 bits the descriptor
// leaves to the backend, compared modulo 2^23; slots <= 2^16 keeps
// free-for-p, published-for-p and free-for-p+slots distinct. The
// notification queue has a whole 64-bit status word per entry and a
// separate claimer word.
//
// Memory ordering: every shared word is accessed with sync/atomic, which
// is sequentially consistent in Go and so orders the plain payload stores
// before the publishing store and the payload loads after the consuming
// load. The doorbell is a Dekker pair: the consumer stores a sleeper
// count then re-checks the ring before it sleeps; a producer stores the
// status word then loads the sleeper counts and only then pays for a
// wake-up. Either the consumer sees the message or the producer sees the
// sleeper. A consumer sleeps one of two ways (wait.go says when):
//
//   - on the doorbell futex word, counted in sleepers: the producer bumps
//     the word and FUTEX_WAKEs it;
//   - parked in the Go netpoller on the FIFO <vpid file>.bell (only if
//     the VPID's wait mode, fixed in the header before the file is
//     linked, is waitBell), counted in bellW: the producer writes one
//     byte to the FIFO, but only if it is the first to swap rung from 0
//     to 1 since the consumer cleared rung (before it stored bellW), so
//     a burst of sends to a sleeping consumer costs one write. The byte
//     stays in the FIFO until the consumer reads it, so a ring that
//     lands before the consumer parks is not lost.
//
// Blocked senders park on the VPID's space bell, the same protocol with
// the roles reversed (space.go); without one they sleep on the space
// futex word. The consumer wakes both after it frees slots.
//
// Faults. Anything in the file may be corrupt. A published slot whose
// descriptor does not decode is dropped and counted (Corrupt). A status
// word that holds no legal state for head is repaired (if no producer
// claimed the position) or skipped (if one did). A slot claimed and never
// published — its producer died between stages 1 and 4 — is skipped at
// once when its mark names a node this NIC knows to be dead, and after
// orphanTimeout otherwise (a producer preempted for a whole second between
// two stores is the price of that rule; it then publishes into a slot that
// the ring has moved past, which the same rule skips again). The ring
// always moves.

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// Mailbox status word: bits 0..39 the descriptor (source node and VPID,
// tag, length; its MC bit is always 0 in a mailbox, because with MC set the
// node field would be read as a group), bit 40 "arrived by multicast", bits
// 41..63 the sequence.
const (
	seqShift = fabric.DescriptorSeqShift + 1
	seqBits  = 64 - seqShift
	seqMask  = 1<<seqBits - 1
	mcFlag   = 1 << fabric.DescriptorSeqShift
	descMask = 1<<fabric.DescriptorSeqShift - 1
	lowMask  = 1<<seqShift - 1
	// claimMark in a not-yet-published status word: length field 0x7F and
	// the MC bit, never a legal mailbox descriptor; the low 16 bits name
	// the claiming node.
	claimMark = 0xFF << 32

	// orphanTimeout is how long a claimed, unpublished slot may block the
	// consumer before it is skipped when its claimer is not known dead.
	orphanTimeout = time.Second
	// maxClaimRetries bounds a producer's CAS loop. Contention retries end
	// fast; only a corrupted tail makes the loop run long, and then the
	// producer treats the ring as full and sleeps with a timeout.
	maxClaimRetries = 1 << 12
)

func seq24(p uint64) uint64 { return p & seqMask }

// seqDiff returns a-b as a signed seqBits-bit difference.
func seqDiff(a, b uint64) int32 { return int32(uint32((a-b)&seqMask)<<(32-seqBits)) >> (32 - seqBits) }

type slotKind uint8

const (
	slotFree      slotKind = iota // free for pos: nothing there yet
	slotClaimed                   // claimed for pos, not yet published
	slotPublished                 // published for pos
	slotBad                       // no legal state for pos: corrupt
)

// classifySlot decodes a mailbox status word as seen by the consumer at
// position pos. For slotPublished it returns the descriptor (err set if it
// does not decode); for slotClaimed, claimer names the claiming node.
func classifySlot(status, pos uint64) (k slotKind, d fabric.Descriptor, claimer fabric.NodeID, err error) {
	seq := status >> seqShift
	low := status & lowMask
	switch {
	case seq == seq24(pos+1):
		if low&(1<<39) != 0 {
			return slotPublished, d, 0, fmt.Errorf("mailbox slot: mc bit in descriptor %#x: %w", low, fabric.ErrInvalid)
		}
		d, err = fabric.DecodeDescriptor(low & descMask)
		d.MC = low&mcFlag != 0
		return slotPublished, d, 0, err
	case seq == seq24(pos) && low == 0:
		return slotFree, d, 0, nil
	case seq == seq24(pos) && low>>16 == claimMark>>16:
		return slotClaimed, d, fabric.NodeID(low), nil
	}
	return slotBad, d, 0, nil
}

// classifyEntry decodes a notification entry's status and claimer words as
// seen by the consumer at position pos, like classifySlot.
func classifyEntry(status, claimer, pos uint64) (k slotKind, node fabric.NodeID, known bool) {
	switch {
	case status == pos+1:
		return slotPublished, 0, false
	case status == pos && claimer == 0:
		return slotFree, 0, false
	case status == pos && claimer <= 1<<16:
		return slotClaimed, fabric.NodeID(claimer - 1), true
	}
	return slotBad, 0, false
}

// vfile is a mapping of one VPID file: the owner's, or a sender's cached
// view of a peer's. All fields are fixed after newVFile.
type vfile struct {
	m        *mapping
	hdr      vpidHeader
	mask     uint64
	nmask    uint64
	state    *atomic.Uint32
	tail     *atomic.Uint64
	ntail    *atomic.Uint64
	doorbell *atomic.Uint32
	sleepers *atomic.Uint32
	bellW    *atomic.Uint32
	rung     *atomic.Uint32
	space    *atomic.Uint32
	spaceW   *atomic.Uint32
	// spaceRung, spacePath, spaceFD: the space bell (space.go): its
	// path in a producer's view of a waitBell VPID (empty otherwise),
	// the owner's descriptor on it (-1 otherwise).
	spaceRung *atomic.Uint32
	spacePath string
	spaceFD   int
	// bellPath names the VPID's doorbell FIFO (a producer's view of a
	// waitBell VPID; empty otherwise), ownFD is the owner's own
	// descriptor on it (the owner's view; -1 otherwise: RMA completions
	// ring the requester's own VPID), and wc counts rings; see
	// ringDoorbell.
	bellPath string
	ownFD    int
	wc       *wakeCounters
	stats    [numVStats]*atomic.Uint64
	mbox     []byte
	nq       []byte
}

func newVFile(m *mapping, h vpidHeader) *vfile {
	b := m.b
	v := &vfile{m: m, hdr: h, mask: uint64(h.Slots - 1), nmask: uint64(h.Depth - 1), ownFD: -1, spaceFD: -1}
	v.state = u32(b, vOffState)
	v.tail = u64(b, vOffTail)
	v.ntail = u64(b, vOffNTail)
	v.doorbell = u32(b, vOffDoorbell)
	v.sleepers = u32(b, vOffSleepers)
	v.rung = u32(b, vOffRung)
	v.bellW = u32(b, vOffBellW)
	v.space = u32(b, vOffSpace)
	v.spaceW = u32(b, vOffSpaceW)
	v.spaceRung = u32(b, vOffSpaceRng)
	for i := range v.stats {
		v.stats[i] = u64(b, vOffStats+8*i)
	}
	v.mbox = b[vOffMailbox : vOffMailbox+h.Slots*fabric.SlotSize]
	nq := vOffMailbox + h.Slots*fabric.SlotSize
	v.nq = b[nq : nq+h.Depth*notifyEntrySize]
	return v
}

// initRings writes the initial "free for position i" states. Only the
// creator calls it, before the file is visible to anyone.
func (v *vfile) initRings() {
	for i := 0; i < v.hdr.Slots; i++ {
		v.slot(uint64(i)).Store(seq24(uint64(i)) << seqShift)
	}
	for i := 0; i < v.hdr.Depth; i++ {
		v.nstatus(uint64(i)).Store(uint64(i))
	}
}

// u64 and u32 view a header word. Offsets are aligned layout constants
// inside the page-aligned mapping; the index expression bounds-checks.
func u64(b []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b[off : off+8][0]))
}

func u32(b []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b[off : off+4][0]))
}

// slot returns the status word of the slot for position pos. The slice
// index is bounds-checked; the mapping is page-aligned, so the word is.
func (v *vfile) slot(pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&v.mbox[(pos&v.mask)*fabric.SlotSize]))
}

func (v *vfile) slotData(pos uint64) []byte {
	o := (pos & v.mask) * fabric.SlotSize
	return v.mbox[o+8 : o+fabric.SlotSize]
}

func (v *vfile) nstatus(pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&v.nq[(pos&v.nmask)*notifyEntrySize]))
}

func (v *vfile) nclaimer(pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&v.nq[(pos&v.nmask)*notifyEntrySize+24]))
}

func (v *vfile) nbody(pos uint64) []byte {
	o := (pos & v.nmask) * notifyEntrySize
	return v.nq[o+8 : o+8+fabric.NotificationSize]
}

// push tries once to put one message into the mailbox. desc is the
// descriptor word with the source filled in; src names the sending node
// for the claim mark. It returns false if the ring is full. It never
// blocks and does not allocate.
func (v *vfile) push(desc uint64, src fabric.NodeID, payload []byte) bool {
	for try := 0; try < maxClaimRetries; try++ {
		pos := v.tail.Load()
		st := v.slot(pos)
		d := seqDiff(st.Load()>>seqShift, pos)
		switch {
		case d == 0:
			if !v.tail.CompareAndSwap(pos, pos+1) {
				continue
			}
			st.Store(seq24(pos)<<seqShift | claimMark | uint64(src))
			copy(v.slotData(pos), payload)
			st.Store(seq24(pos+1)<<seqShift | desc)
			return true
		case d < 0:
			return false // the slot still holds an unconsumed message: full
		}
		// d > 0: another producer moved tail under us; reload.
	}
	return false
}

// ringDoorbell wakes the consumer if it announced it is asleep. The
// caller holds a reference on v.m. It does not allocate; a futex sleeper
// costs a raw FUTEX_WAKE, a FIFO sleeper one raw write(2) by the first
// producer since it fell asleep (the first ring of a mapping also opens
// the FIFO).
func (v *vfile) ringDoorbell() {
	if v.sleepers.Load() != 0 {
		v.doorbell.Add(1)
		sys.FutexWake(v.doorbell, math.MaxInt32) //nolint:errcheck // a failed wake is a slept-out timeout
	}
	if !v.hdr.Bell || v.bellW.Load() == 0 {
		return
	}
	if v.rung.Load() != 0 || v.rung.Swap(1) != 0 {
		return // rung since the consumer last cleared it: the byte is on its way
	}
	if fd := v.bellFD(); fd >= 0 && sys.RingBell(fd) == nil {
		v.wc.rings.Add(1)
		return
	}
	// The consumer's backstop wakes it; let another producer try.
	v.wc.ringFailed.Add(1)
	v.rung.Store(0)
}

// bellFD returns the producer's descriptor on v's doorbell FIFO, opening
// it on first use and caching it with the mapping; -1 if it cannot.
func (v *vfile) bellFD() int {
	if v.ownFD >= 0 {
		return v.ownFD // the owner's view: open until Close takes ops
	}
	if fd := v.m.bell.Load(); fd > 0 {
		return int(fd - 1)
	}
	if v.bellPath == "" {
		return -1
	}
	fd, err := sys.OpenBellWriter(v.bellPath)
	if err != nil {
		return -1
	}
	if !v.m.bell.CompareAndSwap(0, int32(fd+1)) {
		sys.CloseFD(fd) //nolint:errcheck // lost the race to another producer
		return int(v.m.bell.Load() - 1)
	}
	return fd
}

// pushNotify appends one notification. It never blocks: if the queue is
// full it counts the overflow in the queue's header and returns false.
func (v *vfile) pushNotify(n *fabric.Notification, src fabric.NodeID) bool {
	for try := 0; try < maxClaimRetries; try++ {
		pos := v.ntail.Load()
		st := v.nstatus(pos)
		d := int64(st.Load() - pos)
		switch {
		case d == 0:
			if !v.ntail.CompareAndSwap(pos, pos+1) {
				continue
			}
			v.nclaimer(pos).Store(uint64(src) + 1)
			n.Encode(v.nbody(pos))
			st.Store(pos + 1)
			v.stats[vstatKind+int(n.Kind)-1].Add(1)
			if n.Err != fabric.NErrNone && int(n.Err) <= 3 {
				v.stats[vstatErr+int(n.Err)-1].Add(1)
			}
			return true
		case d < 0:
			v.stats[vstatOverflow].Add(1)
			return false
		}
	}
	v.stats[vstatOverflow].Add(1)
	return false
}

// consumer is the owner's private consuming state for one ring.
type consumer struct {
	head       atomic.Uint64 // read by Wait without the lock
	stuckPos   uint64
	stuckSince time.Time
}

// orphaned decides whether the consumer should skip the claimed,
// unpublished position pos, whose claimer is given if known (ok).
func (c *consumer) orphaned(pos uint64, claimer fabric.NodeID, known bool, isDead func(fabric.NodeID) bool) bool {
	if known && isDead(claimer) {
		return true
	}
	now := time.Now()
	if c.stuckPos != pos || c.stuckSince.IsZero() {
		c.stuckPos, c.stuckSince = pos, now
		return false
	}
	return now.Sub(c.stuckSince) >= orphanTimeout
}

// ready reports whether the mailbox head slot holds something for Recv
// (a message, or a claimed slot Recv must look at).
func (v *vfile) mboxReady(head uint64) bool {
	return v.slot(head).Load()>>seqShift == seq24(head+1) || v.tail.Load() > head
}

func (v *vfile) notifyReady(head uint64) bool {
	return v.nstatus(head).Load() == head+1 || v.ntail.Load() > head
}
