package shm

// Wait pipeline: how a consumer sleeps until its rings have work, and how
// it is woken. See ring.go for the producers' side of the doorbell.
//
//	Wait: under ops (read), spin for spinBudget (or less, as the
//	      consumer set it: SetWaitSpin), polling the rings without
//	      yielding. Then clear rung, announce sleep (bellW),
//	      re-check, and park the goroutine in the netpoller on the VPID's
//	      doorbell FIFO (RawConn.Read, draining with raw non-blocking
//	      reads): no thread sits in a blocking system call, so the
//	      runtime's netpoller and sysmon are never held up by it
//	      (docs/wakeup.md). One Wait at a time polls the FIFO (bellMu
//	      guards bellPolling and bellGen); concurrent Waits sleep on
//	      bellCond and are woken by the poller. A VPID that has no FIFO
//	      (counted: BellFallback) sleeps in FUTEX_WAIT in waitSlice
//	      slices instead.
//	Wake: wake-ups of our own Wait (ctx done, Close) write to our own
//	      FIFO and FUTEX_WAKE the doorbell (wakeSelf). There is no
//	      backstop timer: a ring that lands before the consumer parks
//	      stays in the FIFO, and every context of a sleeping Wait is
//	      registered to ring it (watch, under wakeMu; ring takes ops for
//	      reading, so a registration that fires after Close does
//	      nothing).

import (
	"context"
	"math"
	"net"
	"time"

	"github.com/exn-project/exn/fabric/internal/localq"
	"github.com/exn-project/exn/internal/sys"
)

func (e *endpoint) ready() bool {
	return e.v.mboxReady(e.rc.head.Load()) || e.v.notifyReady(e.nc.head.Load())
}

// Wait implements fabric.Endpoint: spin for spinBudget, then park on the
// doorbell (docs/wakeup.md). Close and ctx wake it at once.
func (e *endpoint) Wait(ctx context.Context) error {
	if err := e.enter(); err != nil {
		return err
	}
	defer e.leave()
	if e.ready() {
		return nil
	}
	if ok, err := e.spinFor(time.Duration(e.spin.Load())); ok || err != nil {
		return err
	}
	if done := ctx.Done(); done != nil {
		e.watch(ctx, done)
	}
	v, wc := e.v, &e.nic.wc
	for {
		if e.closed.Load() {
			return net.ErrClosed
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if e.bell == nil {
			// Fallback (no FIFO, counted in BellFallback): a blocking
			// FUTEX_WAIT in waitSlice slices. It holds its thread and P in
			// a system call, which can delay the netpoller by up to
			// sysmon's 10 ms (docs/wakeup.md); only a broken /dev/shm
			// gets here.
			v.sleepers.Add(1)
			s := v.doorbell.Load()
			if e.ready() {
				v.sleepers.Add(^uint32(0))
				return nil
			}
			wc.futexSleeps.Add(1)
			sys.FutexWait(v.doorbell, s, e.nic.opts.backstop) //nolint:errcheck // loop re-checks
			v.sleepers.Add(^uint32(0))
		} else {
			// Clear rung before announcing sleep: a producer that then
			// sees bellW also sees rung clear and writes a byte (see
			// ring.go).
			v.rung.Store(0)
			v.bellW.Add(1)
			if e.ready() {
				v.bellW.Add(^uint32(0))
				return nil
			}
			wc.bellSleeps.Add(1)
			e.sleepBell()
			v.bellW.Add(^uint32(0))
		}
		if e.ready() {
			return nil
		}
	}
}

// SetWaitSpin implements fabric.WaitSpinner: Wait's spin, 0..spinBudget.
func (e *endpoint) SetWaitSpin(d time.Duration) {
	e.spin.Store(int64(min(max(d, 0), spinBudget)))
}

// spinFor polls the rings for up to budget (not at all for 0) without
// yielding: it reports whether work arrived, or net.ErrClosed. No
// Gosched and no sched_yield: the spin is short enough that the
// scheduler never needs to interrupt it, and a yield would put the
// goroutine on the global run queue, where the scheduler finds it before
// it ever polls the network.
func (e *endpoint) spinFor(budget time.Duration) (bool, error) {
	if budget <= 0 {
		return false, nil
	}
	start := time.Now()
	for i := 1; ; i++ {
		if e.ready() {
			return true, nil
		}
		if i%spinCheckEvery == 0 {
			if e.closed.Load() {
				return false, net.ErrClosed
			}
			if time.Since(start) > budget {
				return false, nil
			}
		}
	}
}

// sleepBell parks the calling Wait until the doorbell FIFO is rung (or,
// in tests that set one, a bellBackstop deadline passes) or, for a Wait that is not the poller, the
// poller wakes. The poller's goroutine parks in the netpoller (no thread
// blocks); the others wait on bellCond, so one ring wakes them all. It
// does not allocate.
func (e *endpoint) sleepBell() (rung bool) {
	e.bellMu.Lock()
	if e.bellPolling {
		gen := e.bellGen
		for e.bellPolling && e.bellGen == gen {
			e.bellCond.Wait()
		}
		e.bellMu.Unlock()
		return true // the poller woke: most likely a ring
	}
	e.bellPolling = true
	e.bellMu.Unlock()
	if !e.bellArmed && e.nic.opts.bellBackstop > 0 {
		// Tests only (no timer in production): the deadline stays set
		// across sleeps and is re-armed only once it has passed.
		e.bell.SetReadDeadline(time.Now().Add(e.nic.opts.bellBackstop)) //nolint:errcheck // pollable: checked at open
		e.bellArmed = true
	}
	rung = true
	if err := e.bellRC.Read(e.bellRead); err != nil {
		// A test's deadline passed or, impossible while we hold ops,
		// the file was closed.
		e.bellArmed = false
		e.nic.wc.backstops.Add(1)
		rung = false
	}
	e.bellMu.Lock()
	e.bellPolling = false
	e.bellGen++
	e.bellCond.Broadcast()
	e.bellMu.Unlock()
	return rung
}

// drainBell is the RawConn.Read callback of sleepBell: it consumes every
// byte in the FIFO (raw non-blocking reads) and reports whether there was
// any; false parks the goroutine until the FIFO is readable.
func (e *endpoint) drainBell(fd uintptr) bool {
	n, err := sys.DrainBell(int(fd), e.bellBuf[:])
	if err != nil {
		// Nothing to read from a FIFO we hold open cannot fail; if it
		// does, sleep until the next ring rather than spin on it.
		e.nic.faults.Warn("shm: doorbell read", "vpid", e.addr.VPID, "err", err)
	}
	return n > 0
}

// wakeReg is one context registration of watch.
type wakeReg struct {
	done <-chan struct{}
	stop func() bool
}

// watch makes ctx's end ring the doorbell, unless it already does.
func (e *endpoint) watch(ctx context.Context, done <-chan struct{}) {
	e.wakeMu.Lock()
	defer e.wakeMu.Unlock()
	if e.closed.Load() {
		return
	}
	slot := -1
	for i := range e.wakeRegs {
		r := &e.wakeRegs[i]
		if r.done == done {
			return
		}
		if slot < 0 && (r.done == nil || localq.ClosedChan(r.done)) {
			slot = i
		}
	}
	if slot < 0 {
		slot = e.wakeNext
		e.wakeNext = (e.wakeNext + 1) % maxWatched
	}
	r := &e.wakeRegs[slot]
	if r.stop != nil {
		r.stop()
	}
	r.done, r.stop = done, context.AfterFunc(ctx, e.ringFn)
}

// ring wakes every sleeping Wait; a registration that fires after Close
// does nothing (the mapping may be gone).
func (e *endpoint) ring() {
	if e.enter() != nil {
		return
	}
	defer e.leave()
	e.wakeSelf()
}

// wakeSelf wakes this endpoint's sleeping Waits: a byte in our own FIFO
// (its poller wakes the rest), or a FUTEX_WAKE in waitFutex mode. The
// caller keeps the FIFO open (holds ops, or is Close before it takes ops).
func (e *endpoint) wakeSelf() {
	if e.bell != nil {
		sys.RingBell(e.bellFD) //nolint:errcheck // our own FIFO, opened read-write
	}
	e.v.doorbell.Add(1)                        // a futex-mode Wait (no FIFO) may be asleep
	sys.FutexWake(e.v.doorbell, math.MaxInt32) //nolint:errcheck
}
