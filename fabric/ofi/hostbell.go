//go:build ofi && cgo

package ofi

// Host bells: the wake-up of a NIC whose provider has no wait object
// that another process can signal (ofi:shm, docs/fabric-ofi.md).
//
//	background goroutine, nobody polling the CQ (spinners == 0)
//	  ──► rung = 0; parked += 1 (a full barrier); one progress step (the
//	      re-check); nothing found: park in Go's netpoller on the bell
//	      FIFO, no deadline; drain it; parked -= 1
//	any operation towards peer p (VELO, control packet, RMA)
//	  ──► after the provider call: a full barrier, load p's parked; if
//	      non-zero and this sender wins rung 0→1: write one byte to p's
//	      FIFO
//
// The store of parked and the CQ read by the receiver, against the
// provider's store into the receiver's queue and the load of parked by
// the sender, form a Dekker pair (docs/wakeup.md, "The doorbell
// protocol"): either the re-check finds the packet or the sender rings.
// The byte stays in the FIFO until the receiver drains it, so a ring
// that lands before the park wakes it at once; rung makes a burst of
// sends to a parked receiver cost one write(2).
//
// Files, both in /dev/shm and mode 0600, named after the NIC's address
// (fi_getname, which is what its peers insert and fi_av_lookup returns):
// exn-ofi-HASH.word (one page: the magic at 0, parked at 64 and rung at
// 128, each on its own cache line) and exn-ofi-HASH.bell (the FIFO). The
// NIC that owns them creates them at Open and removes them at Close;
// senders map and open them on first use and forget them when the peer
// goes down or says hello again (it restarted: new files).
//
// Locks: retiredMu guards the retired list. A peer's bell is an atomic
// pointer; two goroutines that open it at once keep one and close the
// other.

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/exn-project/exn/internal/sys"
)

const (
	bellMagic = 0x4c42584f // "OXBL"
	bellSize  = 4096       // the word file: one page
	// Offsets of the shared words, each on its own cache line: the
	// receiver writes parked and rung on every park, senders only read
	// parked (and swap rung once per park).
	bellParkedOff = 64
	bellRungOff   = 128
	// bellDrain is the scratch a drain reads the FIFO into: rung makes
	// one byte per park the common case.
	bellDrain = 64
	// bellRetryAfter spaces the attempts to open a peer's bell that
	// failed, so that a peer without one (permissions, a build without
	// host bells) costs an open(2) a millisecond, not one per message. A
	// peer creates its bell before it first parks on it, so one whose
	// bell cannot be opened yet is not parked on it either.
	bellRetryAfter = time.Millisecond
)

// bellMap is a mapping of a bell's word file.
type bellMap struct {
	mem    []byte
	parked *atomic.Int32
	rung   *atomic.Int32
}

func mapBell(f *os.File) (bellMap, error) {
	mem, err := sys.MapShared(f, bellSize)
	if err != nil {
		return bellMap{}, err
	}
	return bellMap{
		mem:    mem,
		parked: (*atomic.Int32)(unsafe.Pointer(&mem[bellParkedOff])),
		rung:   (*atomic.Int32)(unsafe.Pointer(&mem[bellRungOff])),
	}, nil
}

// ownBell is a NIC's own host bell, which its background goroutine parks
// on. Created by openOwnBell, removed by close.
type ownBell struct {
	base string
	bellMap
	fifo  *os.File // in the netpoller
	fd    int
	rc    syscall.RawConn
	drain [bellDrain]byte
}

// openOwnBell creates the bell files for the NIC whose address is name.
// Stale files of that name (a NIC that died without Close) are replaced.
func openOwnBell(name []byte) (*ownBell, error) {
	b := &ownBell{base: bellBase(name)}
	word, bell := b.base+".word", b.base+".bell"
	os.Remove(word)
	os.Remove(bell)
	f, err := os.OpenFile(word, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host bell: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(bellSize); err != nil {
		os.Remove(word)
		return nil, fmt.Errorf("host bell: %w", err)
	}
	if b.bellMap, err = mapBell(f); err != nil {
		os.Remove(word)
		return nil, fmt.Errorf("host bell: %w", err)
	}
	binary.LittleEndian.PutUint32(b.mem, bellMagic)
	if err := sys.Mkfifo(bell, 0o600); err != nil {
		b.close()
		return nil, fmt.Errorf("host bell: %w", err)
	}
	if b.fifo, b.fd, err = sys.OpenBell(bell); err != nil {
		b.close()
		return nil, fmt.Errorf("host bell: %w", err)
	}
	if b.rc, err = b.fifo.SyscallConn(); err != nil {
		b.close()
		return nil, fmt.Errorf("host bell: %w", err)
	}
	return b, nil
}

// ring writes one byte to fd, the bell's FIFO, if its owner is parked
// and this caller wins rung 0→1 (so a burst of rings to a parked owner
// costs one write). The caller has ordered its publication before the
// load of parked with a full barrier. It reports whether it wrote; a
// write that failed leaves rung clear for the next caller.
func (m bellMap) ring(fd int) (bool, error) {
	if m.parked.Load() == 0 || m.rung.Load() != 0 || m.rung.Swap(1) != 0 {
		return false, nil
	}
	if err := sys.RingBell(fd); err != nil {
		m.rung.Store(0)
		return false, err
	}
	return true, nil
}

// ring wakes the owner's own background goroutine if it is parked on
// the bell (kick, Close, an operation that awaits a completion).
func (b *ownBell) ring() {
	b.bellMap.ring(b.fd) //nolint:errcheck // the FIFO is ours and open: it cannot fail but for EAGAIN, a ring already pending
}

// sleep parks the calling goroutine in the netpoller until the FIFO
// holds a ring (or recheck, called after the park is announced, reports
// there is work), then drains it. The caller announced the park.
func (b *ownBell) sleep(recheck func() bool) {
	if recheck() {
		return
	}
	b.rc.Read(func(uintptr) bool { //nolint:errcheck // a closed FIFO ends the park; Close follows
		n, _ := sys.DrainBell(b.fd, b.drain[:])
		return n > 0
	})
}

// close unmaps and closes the bell and removes its files.
func (b *ownBell) close() {
	if b.fifo != nil {
		b.fifo.Close()
	}
	if b.mem != nil {
		sys.Unmap(b.mem) //nolint:errcheck
		b.mem = nil
	}
	os.Remove(b.base + ".word")
	os.Remove(b.base + ".bell")
}

// peerBell is a sender's view of a peer's host bell.
type peerBell struct {
	bellMap
	fd int
}

// openPeerBell maps the bell of the NIC whose address is name.
func openPeerBell(name []byte) (*peerBell, error) {
	base := bellBase(name)
	f, err := os.OpenFile(base+".word", os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size, err := sys.FileSize(f); err != nil || size != bellSize {
		return nil, fmt.Errorf("host bell %s: size %d, want %d (%v)", base, size, bellSize, err)
	}
	m, err := mapBell(f)
	if err != nil {
		return nil, err
	}
	if binary.LittleEndian.Uint32(m.mem) != bellMagic {
		sys.Unmap(m.mem) //nolint:errcheck
		return nil, fmt.Errorf("host bell %s: bad magic", base)
	}
	fd, err := sys.OpenBellWriter(base + ".bell")
	if err != nil {
		sys.Unmap(m.mem) //nolint:errcheck
		return nil, err
	}
	return &peerBell{bellMap: m, fd: fd}, nil
}

func (b *peerBell) close() {
	sys.CloseFD(b.fd) //nolint:errcheck
	sys.Unmap(b.mem)  //nolint:errcheck
}

// ---- the NIC's side ----

// ringPeer wakes p's background goroutine if it is parked on its host
// bell; called after every provider operation towards p. Without host
// bells it does nothing.
func (n *NIC) ringPeer(p *peer) {
	if n.bell == nil {
		return
	}
	b := p.bell.Load()
	if b == nil {
		if time.Now().UnixNano() < p.bellRetry.Load() {
			return
		}
		if b = n.openPeerBell(p); b == nil {
			p.bellRetry.Store(time.Now().Add(bellRetryAfter).UnixNano())
			return
		}
	}
	p.fence.Add(1) // a full barrier: the provider's store into p's queue before our load of parked
	switch rang, err := b.ring(b.fd); {
	case err != nil:
		n.bellFailed.Add(1)
	case rang:
		n.bellRings.Add(1)
	}
}

// openPeerBell opens p's bell on first use. A peer whose bell cannot be
// opened is retried on an operation at least bellRetryAfter later (and
// at once after its next hello), counted once per failure.
func (n *NIC) openPeerBell(p *peer) *peerBell {
	name, err := n.f.avLookup(p.fa)
	if err != nil {
		n.bellFailed.Add(1)
		return nil
	}
	b, err := openPeerBell(name)
	if err != nil {
		n.bellFailed.Add(1)
		n.faults.Warn("ofi: cannot open a peer's host bell; it may sleep until its next event", "peer", p.node, "err", err)
		return nil
	}
	if !p.bell.CompareAndSwap(nil, b) {
		b.close()
		return p.bell.Load()
	}
	return b
}

// forgetBell drops p's cached bell (p went down or restarted): the next
// ring opens the bell files anew. The old mapping is kept until freeAll,
// since a sender may still be reading it; one per restart of a peer.
func (n *NIC) forgetBell(p *peer) {
	p.bellRetry.Store(0)
	if b := p.bell.Swap(nil); b != nil {
		n.retiredMu.Lock()
		n.retired = append(n.retired, b)
		n.retiredMu.Unlock()
	}
}

// closeBells closes the NIC's own bell and every peer bell; freeAll,
// when no goroutine of the NIC runs.
func (n *NIC) closeBells() {
	if n.bell != nil {
		n.bell.close()
		n.bell = nil
	}
	for _, p := range n.peerList() {
		n.forgetBell(p)
	}
	n.retiredMu.Lock()
	for _, b := range n.retired {
		b.close()
	}
	n.retired = nil
	n.retiredMu.Unlock()
}

// quiescent reports that no operation of this NIC awaits a completion:
// no RMA, no VELO send from a send slot, no control packet in a control
// slot. Completions of such operations can come from the peer
// provider's progress alone (a delivery-complete PUT's acknowledgement),
// which rings no bell, so the background goroutine parks on the bell
// only when there are none (docs/fabric-ofi.md, "Host bells").
func (n *NIC) quiescent() bool {
	return len(n.opFree) == cap(n.opFree) && len(n.txFree) == cap(n.txFree) && n.ctlIdle.Load()
}

// awaitCompletion is called after issuing an operation whose completion
// the NIC's own progress must read: if the background goroutine is
// parked on the bell it is woken, and polls until the NIC is quiescent
// again.
func (n *NIC) awaitCompletion() {
	if b := n.bell; b != nil {
		n.fence.Add(1) // a full barrier: our taking of the slot before the load of parked
		b.ring()
	}
}

// parkOnBell is the background goroutine's idle park on a NIC with a
// host bell: announce, re-check (one progress step, and anything that
// needs the timed poll instead), sleep in the netpoller until a sender
// rings.
func (n *NIC) parkOnBell() {
	b := n.bell
	b.rung.Store(0)
	b.parked.Add(1)
	b.sleep(func() bool {
		if n.kicked.Load() || n.ctlPending.Load() || n.spinners.Load() > 0 || n.closed.Load() || !n.quiescent() {
			return true
		}
		n.progMu.Lock()
		w := n.step()
		n.progMu.Unlock()
		return w
	})
	b.parked.Add(-1)
}

// WakeStats are a NIC's wake-up counters: host-bell rings it sent to
// peers, rings and bell opens that failed (both zero without host
// bells), and how many times its background goroutine woke from a park
// of any kind (bell, CQ wait fd, timed poll); and whether the NIC gave
// up parking on a CQ wait fd that never arms (progress.go, unarmedFor).
type WakeStats struct {
	BellRings, BellFailed, BackgroundWakes uint64
	WaitFDBroken                           bool
}

// WakeStats returns the NIC's wake-up counters.
func (n *NIC) WakeStats() WakeStats {
	return WakeStats{BellRings: n.bellRings.Load(), BellFailed: n.bellFailed.Load(), BackgroundWakes: n.bgWakes.Load(),
		WaitFDBroken: n.waitBroken.Load()}
}

// openBell creates the NIC's own host bell, named after its address.
func (n *NIC) openBell() error {
	name, err := n.f.name()
	if err != nil {
		return err
	}
	b, err := openOwnBell(name)
	if err != nil {
		return err
	}
	n.bell = b
	return nil
}
