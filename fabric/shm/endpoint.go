package shm

// Endpoint pipeline. See ring.go for the ring protocol.
//
//	Send: CheckSend → target lookup (peer table, cached VPID mapping,
//	      acquired for the batch) → push (claim, mark, fill, publish) →
//	      doorbell, only if the consumer sleeps: a raw FUTEX_WAKE for a
//	      futex sleeper, one raw write(2) of a byte to the target's FIFO
//	      (by the first producer since it fell asleep) for a netpoller
//	      sleeper. A full ring: spin for spinBudget, then park in the
//	      netpoller on the target's space bell (space.go), woken by the
//	      consumer's ring, ctx, our Close or the target's death. A target
//	      without one (futex mode): sleep on its space futex in
//	      sendWaitSlice slices, re-checking between slices.
//	Recv: under ops (read) and recvMu, consume from head; wake blocked
//	      senders once per batch. PollNotifications: the same on the
//	      notification queue, under pollMu.
//	Wait: see wait.go (spin, then park on the doorbell FIFO).
//	Post: see rma.go.
//
// Close takes ops for writing, so it waits for every running call (each
// holds ops for reading) before it unmaps anything or closes the FIFO; a
// call blocked in Wait is woken by Close's ring, one blocked in a send
// slice sees closed within one slice.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// sendWaitSlice bounds one futex sleep of a blocked sender whose
	// target has no space bell (a futex-mode VPID), and so how late it
	// notices ctx, Close or a dead target.
	sendWaitSlice = 2 * time.Millisecond
	// spinBudget is how long Wait polls the rings before it parks. It is
	// the cost of what it avoids: parking in the netpoller and being
	// woken through the doorbell FIFO costs a consumer about 5 µs
	// (BenchmarkWakeAcrossProcesses: a cross-process round trip with
	// both sides parked is ~10 µs; docs/wakeup.md has the measurement),
	// so spinning at most that long before parking never costs more
	// than twice the best choice in hindsight (the classic
	// spin-then-block bound), while a ping-pong between two polling
	// consumers (sub-µs round trips) never parks. Longer spins only
	// take the CPU that, on a host with few cores, the peer, the
	// applications and the kernel's network stack need.
	spinBudget = 5 * time.Microsecond
	// waitSlice bounds one futex sleep in Wait (VPIDs without a FIFO);
	// Close, ctx and producers wake it directly, so this is only a
	// backstop.
	waitSlice = 100 * time.Millisecond
	// maxWatched is how many concurrent Waits with distinct contexts
	// have their context's end ring the doorbell at once. One is the
	// normal case (a single consumer loop); beyond maxWatched the
	// oldest registration is replaced, and a Wait still sleeping on it
	// notices its context only at the next ring. Registrations of done
	// contexts are reused first, so only concurrent sleepers count.
	maxWatched = 64
	// bellBufSize is how many doorbell bytes one read drains: one per
	// producer that rang since the last drain, rarely more than a few.
	bellBufSize = 64
	// spinCheckEvery is how many polls pass between clock reads in a spin.
	spinCheckEvery = 64
)

type endpoint struct {
	nic  *nicT
	addr fabric.Addr
	path string
	f    *os.File
	v    *vfile

	ops    sync.RWMutex
	closed atomic.Bool

	recvMu sync.Mutex
	rc     consumer
	pollMu sync.Mutex
	nc     consumer

	// spin is Wait's spin before it parks, in ns: spinBudget unless the
	// consumer shortened it (SetWaitSpin) or the NIC's options switch it
	// off (noSpin).
	spin atomic.Int64

	// wakeRegs are the registrations that ring the doorbell when the
	// context of a sleeping Wait is done, one per context (keyed by its
	// Done channel), for up to maxWatched concurrent Waits with distinct
	// contexts. They are kept across Waits instead of being made and
	// stopped on every sleep: for a context that is not a standard
	// cancelCtx, context.AfterFunc starts a goroutine, and stopping it
	// on every wake-up added a goroutine hand-off (and a futex wake of
	// another thread) to every message that found the consumer asleep.
	// A new context replaces one that is already done, else the oldest;
	// a stale registration only costs one spurious wake-up. wakeMu
	// guards them.
	wakeMu   sync.Mutex
	wakeRegs [maxWatched]wakeReg
	wakeNext int    // the slot to replace when none is done
	ringFn   func() // e.ring, bound once

	// The doorbell FIFO (nil: waitFutex). bell is registered with the
	// netpoller; bellFD is its descriptor for raw reads and writes, valid
	// until Close closes bell (after ops is taken for writing).
	bell     *os.File
	bellFD   int
	bellRC   syscall.RawConn
	bellPath string
	bellRead func(uintptr) bool // e.drainBell, bound once
	// bellMu guards bellPolling and bellGen: one Wait at a time polls
	// the FIFO, the others wait on bellCond for the poller's next wake.
	bellMu      sync.Mutex
	bellCond    sync.Cond
	bellPolling bool
	bellGen     uint64
	// Owned by the polling Wait.
	bellArmed bool // a test's backstop read deadline is set and not yet passed
	bellBuf   [bellBufSize]byte
}

// Open claims VPID v on this node: it creates the VPID file (header,
// mailbox, notification queue) under a temporary name, locks it, and links
// it into place.
func (n *nicT) Open(v fabric.VPID) (fabric.Endpoint, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed.Load() {
		return nil, net.ErrClosed
	}
	addr := fabric.Addr{Node: n.node, VPID: v}
	if n.eps[v] != nil {
		return nil, n.ctr.CountErr(fmt.Errorf("shm: open %v: %w", addr, fabric.ErrInUse))
	}
	path := n.vpidPath(n.node, n.inc, v)
	tmp := path + ".tmp"
	size := vpidFileSize(n.opts.slots, n.opts.depth)
	f, err := createFile(tmp, size)
	if err != nil {
		return nil, fmt.Errorf("shm: open %v: %w", addr, err)
	}
	defer os.Remove(tmp)
	if ok, err := sys.TryLock(f, true); !ok || err != nil {
		f.Close()
		return nil, n.ctr.CountErr(fmt.Errorf("shm: lock %v: %v: %w", addr, err, fabric.ErrInUse))
	}
	b, err := sys.MapShared(f, size)
	if err != nil {
		f.Close()
		return nil, err
	}
	ep := &endpoint{nic: n, addr: addr, path: path, f: f, bellFD: -1, bellPath: path + ".bell"}
	if !n.opts.noSpin {
		ep.spin.Store(int64(spinBudget))
	}
	tmpBell := path + ".tmp.bell"
	if err := ep.openBell(tmpBell); err != nil {
		n.wc.bellFallback.Add(1)
		if !n.opts.noBell {
			n.faults.Warn("shm: no doorbell fifo, the vpid's consumer sleeps on a futex", "vpid", v, "err", err)
		}
	} else {
		defer os.Remove(tmpBell) // after a failure; renamed away on success
	}
	tmpSpace := path + ".tmp.space"
	spaceFD := -1
	if ep.bell != nil {
		if spaceFD = makeSpaceBell(tmpSpace); spaceFD >= 0 {
			defer os.Remove(tmpSpace) // after a failure; renamed away on success
		}
	}
	h := vpidHeader{Addr: addr, Slots: n.opts.slots, Depth: n.opts.depth, Bell: ep.bell != nil}
	encodeVPIDHeader(b, h)
	vf := newVFile(newMapping(b), h)
	vf.wc = &n.wc
	vf.ownFD = ep.bellFD // -1 without a FIFO
	vf.spaceFD = spaceFD
	vf.initRings()
	fail := func(err error) (fabric.Endpoint, error) {
		vf.m.release()
		f.Close()
		if ep.bell != nil {
			ep.bell.Close()
		}
		if spaceFD >= 0 {
			sys.CloseFD(spaceFD) //nolint:errcheck
		}
		return nil, err
	}
	if err := os.Link(tmp, path); err != nil {
		return fail(n.ctr.CountErr(fmt.Errorf("shm: open %v: %v: %w", addr, err, fabric.ErrInUse)))
	}
	if ep.bell != nil {
		// After the link, which makes the VPID ours: a bell already at the
		// name is a dead holder's (same incarnation, a lease VPID).
		// Producers open the FIFO when they first ring, which is after a
		// Wait announced sleep, so after this Open returned.
		if err := os.Rename(tmpBell, ep.bellPath); err != nil {
			vf.state.Store(vpidClosed)
			os.Remove(path)
			return fail(fmt.Errorf("shm: open %v: doorbell: %w", addr, err))
		}
		// Without its space bell (counted by the senders that miss it)
		// the VPID's blocked senders sleep on the space futex.
		if spaceFD >= 0 && os.Rename(tmpSpace, path+".space") != nil {
			sys.CloseFD(spaceFD) //nolint:errcheck
			vf.spaceFD = -1
		}
	}
	ep.v = vf
	ep.ringFn = ep.ring
	ep.bellRead = ep.drainBell
	ep.bellCond.L = &ep.bellMu
	n.eps[v] = ep
	return ep, nil
}

// openBell makes the VPID's doorbell FIFO at tmp and opens it for the
// netpoller. On failure the endpoint stays in waitFutex mode.
func (e *endpoint) openBell(tmp string) error {
	if e.nic.opts.noBell {
		return errors.New("disabled")
	}
	if err := sys.Mkfifo(tmp, 0o600); err != nil {
		return err
	}
	f, fd, err := sys.OpenBell(tmp)
	if err != nil {
		os.Remove(tmp)
		return err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	e.bell, e.bellFD, e.bellRC = f, fd, rc
	return nil
}

func (e *endpoint) Addr() fabric.Addr { return e.addr }

func (e *endpoint) enter() error {
	e.ops.RLock()
	if e.closed.Load() {
		e.ops.RUnlock()
		return net.ErrClosed
	}
	return nil
}

func (e *endpoint) leave() { e.ops.RUnlock() }

// enterConsumer is enter, then mu: the lock of one ring's consumer
// (recvMu for the mailbox, pollMu for the notification queue).
// leaveConsumer releases both, mu first.
func (e *endpoint) enterConsumer(mu *sync.Mutex) error {
	if err := e.enter(); err != nil {
		return err
	}
	mu.Lock()
	return nil
}

func (e *endpoint) leaveConsumer(mu *sync.Mutex) {
	mu.Unlock()
	e.leave()
}

// Send implements fabric.Endpoint. It holds the target's mapping for the
// run of messages to the same target and does not allocate.
func (e *endpoint) Send(ctx context.Context, msgs []fabric.Message) (int, error) {
	if err := e.enter(); err != nil {
		return 0, err
	}
	defer e.leave()
	n := e.nic
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var (
		cur    fabric.Addr
		vf     *vfile
		p      *peer
		dirty  bool
		result error
		i      int
	)
	release := func() {
		if vf != nil {
			if dirty {
				vf.ringDoorbell()
			}
			vf.m.release()
			vf, dirty = nil, false
		}
	}
	for i = 0; i < len(msgs); i++ {
		m := &msgs[i]
		if err := fabric.CheckSend(m); err != nil {
			result = err
			break
		}
		if m.MC {
			release()
			if err := e.multicast(ctx, m); err != nil {
				result = err
				break
			}
			continue
		}
		if vf == nil || m.Peer != cur {
			release()
			var err error
			if p, err = n.getPeer(m.Peer.Node); err == nil {
				vf, err = n.vpid(p, m.Peer.VPID)
			}
			if err != nil {
				result = err
				break
			}
			cur = m.Peer
		}
		desc := fabric.Descriptor{Node: n.node, VPID: e.addr.VPID, Tag: m.Tag, Len: m.Len}.Encode()
		if err := e.push(ctx, p, vf, desc, m.Payload()); err != nil {
			result = err
			break
		}
		dirty = true
		n.ctr.VELOSent.Add(1)
		n.ctr.VELOSentBytes.Add(uint64(m.Len))
	}
	release()
	if result != nil {
		return i, n.ctr.CountErr(fmt.Errorf("shm: send to %v: %w", msgs[i].Peer, result))
	}
	return i, nil
}

// push delivers one message to vf, blocking while the ring is full.
func (e *endpoint) push(ctx context.Context, p *peer, vf *vfile, desc uint64, payload []byte) error {
	if vf.push(desc, e.nic.node, payload) {
		return nil
	}
	e.nic.ctr.SendBlocked.Add(1)
	vf.ringDoorbell() // the consumer may be asleep with a full ring
	for start := time.Now(); time.Since(start) < spinBudget; {
		if vf.push(desc, e.nic.node, payload) {
			return nil
		}
	}
	// Asleep on the target from here on: have the monitor probe at
	// livenessPeriod, so a target that dies is seen promptly.
	n := e.nic
	if n.blocked.Add(1) == 1 {
		select {
		case n.hurry <- struct{}{}:
		default:
		}
	}
	defer n.blocked.Add(-1)
	if vf.spacePath != "" { // a waitBell VPID has a space bell
		if err, ok := e.parkSend(ctx, p, vf, desc, payload); ok {
			return err
		}
	}
	// No space bell (a futex-mode VPID, or it cannot be opened): sleep
	// on the space futex in slices.
	for {
		if err := e.blockedErr(ctx, p, vf); err != nil {
			return err
		}
		vf.spaceW.Add(1)
		s := vf.space.Load()
		if vf.push(desc, e.nic.node, payload) {
			vf.spaceW.Add(^uint32(0))
			return nil
		}
		vf.ringDoorbell()
		sys.FutexWait(vf.space, s, sendWaitSlice) //nolint:errcheck // loop re-checks
		vf.spaceW.Add(^uint32(0))
		if vf.push(desc, e.nic.node, payload) {
			return nil
		}
	}
}

// blockedErr is why a sender blocked on vf's full mailbox stops
// waiting: our Close, ctx, the target node's death or its VPID's close;
// nil to go on waiting.
func (e *endpoint) blockedErr(ctx context.Context, p *peer, vf *vfile) error {
	switch {
	case e.closed.Load():
		return net.ErrClosed
	case ctx.Err() != nil:
		return ctx.Err()
	case !p.self && !p.up():
		return fabric.ErrPeerDown
	case vf.state.Load() != vpidOpen:
		return fabric.ErrUnknownNode
	}
	return nil
}

// multicast sends m to VPID m.Peer.VPID on every live member of group
// m.Peer.Node except this node. Members without that VPID open, or that
// die meanwhile, are skipped.
func (e *endpoint) multicast(ctx context.Context, m *fabric.Message) error {
	n := e.nic
	g := fabric.Group(m.Peer.Node)
	n.scan(false)
	var buf [32]*peer
	members := buf[:0]
	n.peerMu.RLock()
	for _, p := range n.peers {
		if !p.down.Load() && (g == fabric.Broadcast || p.groups.Load()&(1<<g) != 0) {
			members = append(members, p)
		}
	}
	n.peerMu.RUnlock()
	desc := fabric.Descriptor{Node: n.node, VPID: e.addr.VPID, Tag: m.Tag, Len: m.Len}.Encode() | mcFlag
	for _, p := range members {
		vf, err := n.vpid(p, m.Peer.VPID)
		if err != nil {
			continue
		}
		err = e.push(ctx, p, vf, desc, m.Payload())
		vf.ringDoorbell()
		vf.m.release()
		if err != nil && !errors.Is(err, fabric.ErrPeerDown) && !errors.Is(err, fabric.ErrUnknownNode) {
			return err
		}
	}
	n.ctr.MulticastSent.Add(1)
	n.ctr.VELOSent.Add(1)
	n.ctr.VELOSentBytes.Add(uint64(m.Len))
	return nil
}

// Recv implements fabric.Endpoint.
func (e *endpoint) Recv(msgs []fabric.Message) (int, error) {
	if err := e.enterConsumer(&e.recvMu); err != nil {
		return 0, err
	}
	defer e.leaveConsumer(&e.recvMu)
	v, n := e.v, 0
	slots := uint64(v.hdr.Slots)
	head := e.rc.head.Load()
	freed, bytes := 0, uint64(0)
loop:
	for n < len(msgs) {
		st := v.slot(head)
		s := st.Load()
		k, d, claimer, err := classifySlot(s, head)
		switch k {
		case slotPublished:
			if err != nil {
				e.nic.ctr.Corrupt.Add(1)
				e.nic.faults.Warn("shm: dropped undecodable mailbox slot", "vpid", e.addr.VPID, "err", err)
			} else {
				m := &msgs[n]
				m.Peer = fabric.Addr{Node: d.Node, VPID: d.VPID}
				m.MC, m.Tag, m.Len = d.MC, d.Tag, d.Len
				copy(m.Data[:d.Len], v.slotData(head))
				n++
				bytes += uint64(d.Len)
			}
		case slotFree, slotClaimed:
			if v.tail.Load() <= head {
				break loop // empty
			}
			if !e.rc.orphaned(head, claimer, k == slotClaimed, e.nic.isDead) {
				break loop // a producer is still filling it
			}
			e.nic.ctr.Corrupt.Add(1)
			e.nic.faults.Warn("shm: skipped mailbox slot its producer never published", "vpid", e.addr.VPID, "claimer", claimer)
		case slotBad:
			e.nic.ctr.Corrupt.Add(1)
			e.nic.faults.Warn("shm: corrupt mailbox status word", "vpid", e.addr.VPID, "word", s)
			if v.tail.Load() <= head {
				// Nobody claimed it: repair it so producers can.
				st.CompareAndSwap(s, seq24(head)<<seqShift)
				break loop
			}
		}
		st.Store(seq24(head+slots) << seqShift)
		head++
		freed++
	}
	if freed > 0 {
		e.rc.head.Store(head)
		v.wakeSenders()
	}
	if n > 0 {
		e.nic.ctr.VELORecv.Add(uint64(n))
		e.nic.ctr.VELORecvBytes.Add(bytes)
	}
	return n, nil
}

// PollNotifications implements fabric.Endpoint.
func (e *endpoint) PollNotifications(ns []fabric.Notification) (int, error) {
	if err := e.enterConsumer(&e.pollMu); err != nil {
		return 0, err
	}
	defer e.leaveConsumer(&e.pollMu)
	v, n := e.v, 0
	depth := uint64(v.hdr.Depth)
	head := e.nc.head.Load()
	moved := false
loop:
	for n < len(ns) {
		st := v.nstatus(head)
		cl := v.nclaimer(head)
		s := st.Load()
		k, claimer, known := classifyEntry(s, cl.Load(), head)
		switch k {
		case slotPublished:
			nt, err := fabric.DecodeNotification(v.nbody(head))
			if err != nil {
				e.nic.ctr.Corrupt.Add(1)
				e.nic.faults.Warn("shm: dropped undecodable notification", "vpid", e.addr.VPID, "err", err)
			} else {
				ns[n] = nt
				n++
			}
		case slotFree, slotClaimed:
			if v.ntail.Load() <= head {
				break loop
			}
			if !e.nc.orphaned(head, claimer, known, e.nic.isDead) {
				break loop
			}
			e.nic.ctr.Corrupt.Add(1)
			e.nic.faults.Warn("shm: skipped notification its producer never published", "vpid", e.addr.VPID)
		case slotBad:
			e.nic.ctr.Corrupt.Add(1)
			e.nic.faults.Warn("shm: corrupt notification status word", "vpid", e.addr.VPID, "word", s)
			if v.ntail.Load() <= head {
				cl.Store(0)
				st.CompareAndSwap(s, head)
				break loop
			}
		}
		cl.Store(0)
		st.Store(head + depth)
		head++
		moved = true
	}
	if moved {
		e.nc.head.Store(head)
	}
	return n, nil
}

// Close implements fabric.Endpoint: it marks the VPID file closed (so
// cached senders stop), wakes waiters, waits for running calls, releases
// the VPID's regions and unlinks its file and its doorbell FIFO (producers
// that still hold the FIFO open keep ringing an unlinked pipe, harmlessly,
// until they drop their mapping).
func (e *endpoint) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	n := e.nic
	v := e.v
	v.state.Store(vpidClosed)
	e.wakeSelf()
	v.space.Add(1)
	sys.FutexWake(v.space, math.MaxInt32) //nolint:errcheck
	if v.spaceFD >= 0 {
		sys.RingBell(v.spaceFD) //nolint:errcheck // senders parked on us see the state
	}
	n.wakeParked(e, nil) // our own senders parked on a full target
	e.wakeMu.Lock()
	for i := range e.wakeRegs {
		if r := &e.wakeRegs[i]; r.stop != nil {
			r.stop()
			*r = wakeReg{}
		}
	}
	e.wakeMu.Unlock()
	e.ops.Lock()
	defer e.ops.Unlock()
	n.regMu.Lock()
	for idx, r := range n.regions {
		if r.owner == e.addr.VPID {
			n.dropRegionLocked(idx, r)
		}
	}
	n.regMu.Unlock()
	os.Remove(e.path)
	if e.bell != nil {
		os.Remove(e.bellPath)
		e.bell.Close()
	}
	if v.spaceFD >= 0 {
		os.Remove(e.path + ".space")
		sys.CloseFD(v.spaceFD) //nolint:errcheck
	}
	n.mu.Lock()
	if n.eps[e.addr.VPID] == e {
		n.eps[e.addr.VPID] = nil
	}
	for i := range n.folded {
		n.folded[i].Add(v.stats[i].Load())
	}
	n.mu.Unlock()
	v.m.release()
	e.f.Close()
	return nil
}
