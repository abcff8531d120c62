//go:build ofi && cgo

package ofi

// Progress: the caller drives it.
//
//	waiting caller (Wait, a sender out of credits, a region query, an
//	  RMA issue that found the provider queue full)
//	  ──► spin up to a named budget: poll() = progMu.TryLock, one exn_poll
//	      (read a batch of completions, stage received packets, repost
//	      their buffers: one cgo call), queued control packets and jobs
//	  ──► park on its own wake channel (endpoint) or condition
//	background goroutine (one per NIC, started by Open, joined by Close)
//	  ──► progMu.Lock, one progress step; work found: again
//	  ──► a caller is spinning (spinners > 0): park on bgWake, which the
//	      last spinner to leave rings
//	  ──► fd provider (tcp): park in Go's netpoller on a dup of the CQ wait
//	      fd after fi_trywait and a poll(0) of its level; the provider's
//	      events (data in, room to send) or fi_cq_signal (kick) wake it;
//	      no deadline
//	  ──► no wait object (shm 1.17), nothing of ours awaiting a completion
//	      (quiescent): park in Go's netpoller on the NIC's host bell, which
//	      peers ring after operations towards it (hostbell.go); no deadline
//	  ──► no wait object, operations of ours outstanding (their completions
//	      may come from the peer provider's progress alone, which rings
//	      nothing): sleep idle/64, 20 µs..1 ms, on a timer that bgWake cuts
//	      short (docs/fabric-ofi.md: the missing capability)
//	control packets ──► sendCtl: fi_inject at once (ctlMu, so they stay in
//	      order) when they fit the provider's inject size and nothing is
//	      queued; else ctlQ, sent from send slots by the next progress step
//
// Locks: progMu (the CQ, the staging batch, ctlFree/ctlDests, jobs run
// under it: MR closes never race a progress step), ctlMu (ctlQ, the
// inject scratch buffer; taken inside progMu, never the other way).

import (
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/exn-project/exn/fabric"
)

// Progress budgets.
const (
	// waitSpin is how long a waiting caller polls the CQ itself before
	// it parks. It covers a VELO round trip on ofi:tcp between two
	// processes (about 25 µs here, docs/fabric-ofi.md) with room for a
	// scheduling hiccup, so a busy ping-pong never parks, while an idle
	// endpoint costs one such spin per Wait.
	waitSpin = 50 * time.Microsecond
	// waitSpinMin is the least an endpoint's Wait spins on a provider
	// with a wait fd once its waits have kept outlasting their spin
	// (waitBudget): on ofi:tcp every spin step is a system call
	// (epoll_wait), and while exn0 streams the GETs a receiver waits for
	// take 100-200 µs, so a full spin before each park cost 8 % of the
	// throughput and a tenth of the CPU per byte (docs/fabric-ofi.md,
	// "Adaptive spin"). One or two steps still catch what is already
	// on its way.
	waitSpinMin = 2 * time.Microsecond
	// progressPollSleep and progressPollMax bound the timed sleep of the
	// background goroutine on a provider without a wait object while a
	// caller spins or an operation of ours awaits its completion: 1/64
	// of the idle time so far, so an exchange that just paused pays tens
	// of µs. Once nothing is outstanding it parks on the host bell
	// instead, with no timer.
	progressPollSleep = 20 * time.Microsecond
	progressPollMax   = time.Millisecond
	// spinClockEvery is how many spin steps pass between two reads of
	// the clock against waitSpin. On this VM a clock read costs about as
	// much as an empty progress step on ofi:shm (a perf profile of the
	// VELO ping-pong put 15 % of its samples in clock_gettime), and 8
	// steps are still far below a microsecond past the budget.
	spinClockEvery = 8
)

// waitBudget is the spin budget of one endpoint's Wait on a provider
// with a wait fd, between waitSpinMin and waitSpin. A wait that parks
// halves it; a wait that ends within its spin keeps it. While it is below
// waitSpin, every waitProbe-th wait spins the whole waitSpin instead, and
// one that ends within that spin restores the budget: so a ping-pong
// (round trips well inside waitSpin) that lost its budget to a few slow
// round trips gets it back within waitProbe waits, and a stream whose
// waits outlast waitSpin pays a full spin once per waitProbe waits. (The
// wake-up itself says nothing about when the item came: on an fd
// provider the item is seen only once the background goroutine has been
// woken for it, tens of µs later on this VM.) Owned by the endpoint's
// waiter; the fields are atomic because Wait may be called by several
// goroutines (a racing update loses one adjustment).
type waitBudget struct {
	ns    atomic.Int64 // 0: waitSpin
	waits atomic.Uint32
}

// waitProbe is how often a waiter below its full budget spins the whole
// waitSpin to find out whether its waits have become short again: one
// in 16 costs a streaming receiver a sixteenth of the full spin it saved.
const waitProbe = 16

// get returns the spin of the next wait.
func (b *waitBudget) get() time.Duration {
	v := time.Duration(b.ns.Load())
	if v == 0 || v >= waitSpin {
		return waitSpin
	}
	if b.waits.Add(1)%waitProbe == 0 {
		return waitSpin // probe
	}
	return v
}

// hit records a wait that ended within a spin of budget.
func (b *waitBudget) hit(budget time.Duration) {
	if budget >= waitSpin {
		b.ns.Store(0)
	}
}

// parked records a wait whose spin ran out.
func (b *waitBudget) parked() {
	v := time.Duration(b.ns.Load())
	if v == 0 {
		v = waitSpin
	}
	b.ns.Store(int64(max(waitSpinMin, v/2)))
}

// poll runs one progress step unless another goroutine is running one
// (then that one makes the progress). It reports whether it found work.
func (n *NIC) poll() bool {
	if !n.progMu.TryLock() {
		return false
	}
	w := n.step()
	n.progMu.Unlock()
	return w
}

// spinStep is one turn of a caller's spin: a progress step, then a
// yield (runtime.Gosched) when another goroutine holds the progress lock
// (it needs a P to finish, on 2 vCPUs), or when the step found nothing
// on a provider with a wait fd. Such a provider's transport is the
// kernel's (ofi:tcp): a spinner that never yields keeps the CPU that
// the kernel's network processing needs, and the round trip doubled
// (docs/fabric-ofi.md, "Why the ofi spins still yield"). On ofi:shm the
// peer writes into shared memory itself, and an empty step polls again
// at once.
func (n *NIC) spinStep() {
	if !n.progMu.TryLock() {
		runtime.Gosched()
		return
	}
	w := n.step()
	n.progMu.Unlock()
	if !w && n.waitable {
		runtime.Gosched()
	}
}

// step is one progress step; progMu held.
func (n *NIC) step() bool {
	work := false
	if n.ctlPending.Load() {
		work = n.drainCtl()
	}
	b := n.batch
	got, err := n.f.poll(b, n.rx, n.rxMR.desc)
	if e := n.f.repostErrs(); e != n.repostErrs {
		n.repostErrs = e
		n.faults.Warn("ofi receive repost failed; retried on the next progress step", "failures", e)
	}
	switch {
	case err == errAvail:
		n.handleCQErr(b)
		work = true
	case err != nil:
		n.faults.Warn("ofi cq read failed", "err", err)
	}
	for i := range got {
		c, length, src, rerr := b.entry(i)
		n.complete(c, length, src, b, i)
		if rerr != nil {
			n.repostLater(c.index(), rerr)
		}
	}
	return work || got > 0
}

// spinUntil drives progress until cond holds or waitSpin passes; it
// reports whether cond held.
func (n *NIC) spinUntil(cond func() bool) bool {
	n.spinners.Add(1)
	start := time.Now()
	for i := 1; ; i++ {
		if cond() {
			n.unspin(true)
			return true
		}
		n.spinStep()
		if i%spinClockEvery == 0 && time.Since(start) > waitSpin {
			n.unspin(false)
			return false
		}
	}
}

// unspin ends a caller's spin (done: it found what it waited for); the
// last one out lets the background goroutine park on the wait fd again.
// Without a wait fd the background sleeps on its timer meanwhile, and a
// spin that succeeded does not wake it: on ofi:shm that wake-up made the
// background step between every two operations of a busy caller and
// contend with its next one for the provider's locks
// (docs/fabric-ofi.md, "RMA against a raw libfabric loop").
func (n *NIC) unspin(done bool) {
	if n.spinners.Add(-1) == 0 && n.bgParked.Load() && !(done && !n.waitable) {
		select {
		case n.bgWake <- struct{}{}:
		default:
		}
	}
}

// kick wakes the background goroutine for queued work or Close.
func (n *NIC) kick() {
	n.kicked.Store(true)
	if n.bgParked.Load() {
		select {
		case n.bgWake <- struct{}{}:
		default:
		}
		if n.waitRC != nil {
			n.f.signal()
		}
		if n.bell != nil {
			n.bell.ring()
		}
	}
}

// openWaitFile wraps the CQ wait fd's dup for the netpoller; nil if the
// provider has none or Go cannot poll it.
func (n *NIC) openWaitFile() {
	fd := n.f.pollFD()
	if fd < 0 {
		return
	}
	f := os.NewFile(uintptr(fd), "ofi-cq-wait")
	// SetReadDeadline fails on a file the netpoller does not watch: a
	// RawConn.Read on it would block a thread instead of parking.
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(time.Time{}) != nil {
		f.Close()
		return
	}
	n.waitFile, n.waitRC, n.waitable = f, rc, true
}

// unarmedFor is how long parks may keep returning at once because the
// provider says its wait fd is not armed, each followed by a step that
// found nothing, before the NIC stops trusting that fd. A working
// provider re-arms after one such round (fi_trywait resets its signal),
// or within rxm's connection-management interval (10 ms by default:
// rxm reads a connecting socket only that often, and the fd stays
// readable meanwhile); one whose fi_trywait does nothing (libfabric's
// native TCP engine before 1.19, which getinfo already refuses) never
// does, and its NIC woke 1.3 million times a second. A count of rounds
// instead fired on ofi:tcp while connections came up.
const unarmedFor = 100 * time.Millisecond

// background is the NIC's one goroutine: it progresses when no caller
// does, and parks otherwise.
func (n *NIC) background() {
	defer n.wg.Done()
	idleSince := time.Now()
	idle := time.NewTimer(time.Hour)
	idle.Stop()
	defer idle.Stop()
	var unarmedSince time.Time // start of the current run of unarmed parks
	lastUnarmed := false
	for {
		select {
		case <-n.done:
			n.progMu.Lock()
			n.runJobs()
			n.progMu.Unlock()
			return
		default:
		}
		n.progMu.Lock()
		w := n.step()
		n.progMu.Unlock()
		if w {
			idleSince = time.Now()
			unarmedSince = time.Time{}
			continue
		}
		switch {
		case !lastUnarmed:
			unarmedSince = time.Time{}
		case unarmedSince.IsZero():
			unarmedSince = time.Now()
		case time.Since(unarmedSince) >= unarmedFor && !n.waitBroken.Swap(true):
			n.log.Warn("ofi: the provider's CQ wait fd stays readable after fi_trywait with nothing to read; "+
				"parking on it would spin, so this NIC polls on a timer instead (docs/fabric-ofi.md, \"Providers exn cannot park on\")",
				"provider", n.f.provider(), "for", time.Since(unarmedSince))
		}
		lastUnarmed = n.park(idle, idleSince)
		n.bgWakes.Add(1)
	}
}

// park sleeps until there may be work for the background goroutine. It
// reports whether it returned at once only because the provider said
// its wait fd was not armed (background times runs of those, unarmedFor).
func (n *NIC) park(idle *time.Timer, idleSince time.Time) (unarmed bool) {
	n.bgParked.Store(true)
	defer n.bgParked.Store(false)
	if n.kicked.Swap(false) || n.ctlPending.Load() {
		return false
	}
	if n.spinners.Load() > 0 && n.waitable {
		// A caller is polling: it makes the progress, and wakes us when
		// it stops. (Without a wait fd: the timed sleep below.)
		select {
		case <-n.bgWake:
		case <-n.done:
		}
		return false
	}
	if n.waitRC != nil && !n.waitBroken.Load() {
		calls := 0
		n.waitRC.Read(func(uintptr) bool {
			calls++
			// fi_trywait first: it resets the provider's signal, so a
			// kick that raced it is seen in kicked afterwards. trywait
			// also polls the fd's level (cgo_data.c exn_trywait): the
			// netpoller reports edges only, so no deadline is needed.
			armed := n.f.trywait()
			if n.kicked.Load() || n.ctlPending.Load() || n.spinners.Load() > 0 || n.closed.Load() {
				calls = -1 // woken for a reason of ours
				return true
			}
			return !armed // not armed: completions pending, go read them
		})
		return calls == 1
	}
	if n.bell != nil && n.spinners.Load() == 0 && n.quiescent() {
		n.parkOnBell()
		return false
	}
	idle.Reset(min(max(time.Since(idleSince)/64, progressPollSleep), progressPollMax))
	select {
	case <-idle.C:
	case <-n.bgWake:
		idle.Stop()
	case <-n.done:
		idle.Stop()
	}
	return false
}

// ---- control packets ----

// sendCtl sends a control packet to node dst, inline (fi_inject) when it
// can, else queued for the next progress step; if dst is this node it is
// handled at once. body is copied.
func (n *NIC) sendCtl(dst fabric.NodeID, h header, body []byte) {
	h.desc.Node = n.id
	if dst == n.id {
		n.dispatch(h, n.id, body)
		return
	}
	hdr := h.encode()
	n.ctlMu.Lock()
	if len(n.ctlQ) == 0 {
		sent, down, err := n.injectCtl(dst, hdr, body)
		if sent {
			n.ctlMu.Unlock()
			if down != nil {
				n.faults.Warn("ofi control send failed", "peer", dst, "err", err)
				n.peerDown(down, err.Error())
			}
			return
		}
	}
	n.ctlQ = append(n.ctlQ, ctlPkt{dst: dst, hdr: hdr, n: uint8(len(body))})
	copy(n.ctlQ[len(n.ctlQ)-1].body[:], body)
	n.ctlPending.Store(true)
	n.ctlMu.Unlock()
	n.kick()
}

// injectCtl tries to send one control packet inline; ctlMu held. sent
// reports that the packet is done with (sent, or dropped for a peer
// that is down or unknown); down is a peer the send failed to, to be
// marked down by the caller once ctlMu is released.
func (n *NIC) injectCtl(dst fabric.NodeID, hdr uint64, body []byte) (sent bool, down *peer, err error) {
	size := headerSize + len(body)
	if size > n.inject {
		return false, nil, nil
	}
	p := n.peer(dst)
	if p == nil {
		return true, nil, nil
	}
	if ptype(hdr>>hdrTypeShift) != pByeAck { // the one packet a down peer gets: it waits for it
		if !p.enter() {
			return true, nil, nil
		}
		defer p.leave()
	}
	buf := n.ctlScratch.bytes()[:size]
	putHeader(buf, hdr)
	copy(buf[headerSize:], body)
	err = n.f.inject(n.ctlScratch.p, size, p.fa)
	switch {
	case err == nil:
		n.ringPeer(p)
		return true, nil, nil
	case isAgain(err):
		n.ringPeer(p) // a full queue (or shm's connection set-up) drains by p's progress
		return false, nil, nil
	}
	return true, p, err
}

// runJob runs fn under progMu, so never concurrently with a progress
// step (MR closes must not race the provider's progress).
func (n *NIC) runJob(fn func()) {
	n.progMu.Lock()
	defer n.progMu.Unlock()
	fn()
}

// runJobs runs the queued jobs (receive reposts that failed); progMu held.
func (n *NIC) runJobs() {
	n.ctlMu.Lock()
	jobs := n.jobs
	n.jobs = nil
	n.ctlMu.Unlock()
	for _, j := range jobs {
		j()
	}
}

// drainCtl runs queued jobs and sends queued control packets while slots
// last; progMu held. It reports whether it did anything.
func (n *NIC) drainCtl() bool {
	n.runJobs()
	n.ctlMu.Lock()
	defer n.ctlMu.Unlock()
	q := n.ctlQ
	sent := 0
	var downs []*peer
	for i := range q {
		pk := &q[i]
		ok, down, err := n.injectCtl(pk.dst, pk.hdr, pk.body[:pk.n])
		if down != nil {
			n.faults.Warn("ofi control send failed", "peer", pk.dst, "err", err)
			downs = append(downs, down)
		}
		if ok {
			sent++
			continue
		}
		if headerSize+int(pk.n) <= n.inject || len(n.ctlFree) == 0 {
			break // the provider's queue or our slots are full: next step
		}
		p := n.peer(pk.dst)
		if p == nil {
			sent++
			continue
		}
		if ptype(pk.hdr>>hdrTypeShift) != pByeAck && !p.enter() {
			sent++ // a down peer gets nothing else
			continue
		}
		slot := n.ctlFree[len(n.ctlFree)-1]
		buf := unsafe.Slice((*byte)(n.ctl.at(int(slot)*packetSize)), packetSize)
		putHeader(buf, pk.hdr)
		copy(buf[headerSize:], pk.body[:pk.n])
		err = n.f.send(n.ctl.at(int(slot)*packetSize), headerSize+int(pk.n), n.ctlMR.desc, p.fa, mkctx(ctxCtrl, int(slot)))
		if err == nil || isAgain(err) {
			n.ringPeer(p)
		}
		if ptype(pk.hdr>>hdrTypeShift) != pByeAck {
			p.leave()
		}
		if err != nil {
			if isAgain(err) {
				break
			}
			n.faults.Warn("ofi control send failed", "peer", pk.dst, "err", err)
			downs = append(downs, p)
			sent++
			continue
		}
		n.ctlFree = n.ctlFree[:len(n.ctlFree)-1]
		n.ctlDests[slot] = p
		n.ctlIdle.Store(false)
		n.awaitCompletion()
		sent++
	}
	n.ctlQ = append(n.ctlQ[:0], q[sent:]...)
	n.ctlPending.Store(len(n.ctlQ) > 0)
	n.ctlIdle.Store(len(n.ctlQ) == 0 && len(n.ctlFree) == ctlSlots)
	if len(downs) > 0 {
		n.ctlMu.Unlock()
		for _, p := range downs {
			n.peerDown(p, "control send failed")
		}
		n.ctlMu.Lock()
	}
	return sent > 0
}

// complete handles successful completion i of batch b.
func (n *NIC) complete(c opctx, length int, src uint64, b *cqBatch, i int) {
	switch c.kind() {
	case ctxRecv:
		n.receive(b.packet(i, length), src) // exn_poll already reposted the buffer
	case ctxSend:
		n.txDests[c.index()].Store(nil)
		n.txFree <- int32(c.index())
	case ctxCtrl:
		n.ctlDests[c.index()] = nil
		n.ctlFree = append(n.ctlFree, int32(c.index()))
		n.ctlMu.Lock()
		n.ctlIdle.Store(len(n.ctlQ) == 0 && len(n.ctlFree) == ctlSlots)
		n.ctlMu.Unlock()
	case ctxRMA:
		n.rmaDone(c.index(), nil)
	}
}

// repostLater retries a receive repost that failed from a job, so the
// slot is not lost.
func (n *NIC) repostLater(i int, err error) {
	if !isAgain(err) {
		n.faults.Warn("ofi receive repost failed", "slot", i, "err", err)
	}
	n.ctlMu.Lock()
	n.jobs = append(n.jobs, func() {
		if err := n.f.postRecv(n.rx.at(i*recvSize), recvSize, n.rxMR.desc, mkctx(ctxRecv, i)); err != nil {
			n.repostLater(i, err)
		}
	})
	n.ctlPending.Store(true)
	n.ctlMu.Unlock()
}

// handleCQErr reads one error completion and fails what it belonged to;
// progMu held.
func (n *NIC) handleCQErr(b *cqBatch) {
	e, ok := n.f.cqReadErr(b)
	if !ok {
		return
	}
	c := opctx(e.ctx)
	switch c.kind() {
	case ctxRecv:
		// A receive fails only when the endpoint is being closed or a
		// message did not fit (a peer speaking another protocol).
		n.ctr.Corrupt.Add(1)
		n.faults.Warn("ofi receive failed", "err", e.detail)
		if !n.closed.Load() {
			i := c.index()
			if err := n.f.postRecv(n.rx.at(i*recvSize), recvSize, n.rxMR.desc, mkctx(ctxRecv, i)); err != nil {
				n.repostLater(i, err)
			}
		}
	case ctxSend:
		i := c.index()
		if p := n.txDests[i].Swap(nil); p != nil {
			n.peerDown(p, "send failed: "+e.detail)
		}
		n.txFree <- int32(i)
	case ctxCtrl:
		i := c.index()
		if p := n.ctlDests[i]; p != nil {
			n.peerDown(p, "control send failed: "+e.detail)
		}
		n.ctlDests[i] = nil
		n.ctlFree = append(n.ctlFree, int32(i))
	case ctxRMA:
		n.rmaDone(c.index(), &e)
	default:
		n.faults.Warn("ofi error completion without context", "err", e.detail)
	}
}
