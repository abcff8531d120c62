package dring

// Parking on the one bell of a side (docs/direct.md, "Ringing and
// parking with one bell").
//
// A side's readers (waiting for data) and writers (waiting for space)
// park on the same bell, and a drain of it may take the byte another
// waiter of this process needed. So at most one goroutine of the
// Endpoint waits on the bell at a time (the bell waiter, e.waiting);
// another parked call (a reader while a writer waits, or the reverse)
// waits on wcond until gen moves. The bell waiter bumps gen after every
// drain (drained) and when it stops waiting (stopWaiting); the next
// parked call then becomes the bell waiter.
//
// No wake-up is lost (the Dekker pairs of docs/direct.md, one more
// link): a waiter counts itself in (cons_wait or prod_wait, an atomic
// add), reads gen, and only then re-checks its ring. A peer that stored
// after that re-check finds the count and rings (or skips because its
// rung flag is set: then a byte is pending or a drain has not yet
// cleared the flag, and that clear, after the peer's store, comes before
// a bump); the byte, whoever drains it, is drained before a bump that
// the waiter sees as a gen other than the one it read, and it looks
// again. A drain clears both rung flags that target this side (rx's
// data_rung: the peer rang for data; tx's space_rung: for space) after
// reading the bell to EAGAIN, and the bell waiter then re-checks its own
// ring, as the protocol asks.
//
// End of file on the bell (every holder of the peer's bell closed it:
// the peer side is gone) resets the connection unless the peer had
// finished with it: rst, or its fin together with its rd_closed (its
// last close) or with this side's fin (fin both ways). A peer that
// finished leaves nothing to wait for: a reader finds fin, a writer
// rd_closed.
//
// Without a bell (Attach without one, until SetBell), or while another
// process's waiters park on it (SetPollOnly, until SetRelay), the bell
// waiter polls the ring with a sleep that doubles up to noBellPoll,
// bumping gen at each look; exnd parks so only before a relay, for
// bytes written behind the shim's back into a full ring.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/internal/sys"
)

// noBellPoll bounds the sleep of a bell waiter without a bell.
const noBellPoll = time.Millisecond

// park waits until w.ready() holds: spin SpinBudget, then announce the
// waiter in w.count, re-check, and wait on the bell (or for the bell
// waiter's broadcast).
func (e *Endpoint) park(w *waiter) error {
	for t0 := time.Now(); time.Since(t0) < SpinBudget; {
		if w.ready() {
			return nil
		}
		if e.closed.Load() {
			return net.ErrClosed
		}
	}
	w.count.Add(1)
	defer w.count.Add(^uint32(0))
	for {
		e.wmu.Lock()
		gen, lead := e.gen, !e.waiting
		e.waiting = true
		e.wmu.Unlock()
		// After the count and gen: see the file comment.
		if w.ready() {
			if lead {
				e.stopWaiting()
			}
			return nil
		}
		if e.closed.Load() {
			if lead {
				e.stopWaiting()
			}
			return net.ErrClosed
		}
		if lead {
			err := e.waitBell(w)
			e.stopWaiting()
			return err
		}
		e.wmu.Lock()
		for e.gen == gen && !e.closed.Load() {
			e.wcond.Wait()
		}
		e.wmu.Unlock()
	}
}

// bump moves gen and wakes the calls waiting for it.
func (e *Endpoint) bump() {
	e.wmu.Lock()
	e.gen++
	e.wcond.Broadcast()
	e.wmu.Unlock()
}

// stopWaiting ends the bell waiter's turn: another parked call takes it.
func (e *Endpoint) stopWaiting() {
	e.wmu.Lock()
	e.waiting = false
	e.gen++
	e.wcond.Broadcast()
	e.wmu.Unlock()
}

// waitBell is the bell waiter's wait: until w.ready() holds (nil), or
// the Endpoint is closed (net.ErrClosed), reset here (ErrReset), or the
// bell is gone with w still waiting (ErrReset).
func (e *Endpoint) waitBell(w *waiter) error {
	sleep := 10 * time.Microsecond
	for {
		if e.closed.Load() {
			return net.ErrClosed
		}
		if e.bell.Load() < 0 || e.pollOnly.Load() {
			// No bell yet, or not ours to drain: look again after a
			// sleep (file comment).
			time.Sleep(sleep)
			sleep = min(2*sleep, noBellPoll)
			e.bump()
			if w.ready() {
				return nil
			}
			continue
		}
		rc, err := e.register()
		if err != nil {
			return err
		}
		err = rc.Read(w.cb)
		switch {
		case e.closed.Load():
			return net.ErrClosed
		case w.ready():
			return nil
		case err != nil && e.woken.Load():
			return ErrReset // woken by Reset; a forged buffer cleared rst since
		case err != nil:
			return fmt.Errorf("dring: bell: %w", err)
		case e.peerGone.Load():
			return ErrReset // nothing can ring this side any more
		}
	}
}

// drained is the netpoller callback of the bell waiter w on the bell
// fd (its netpoller dup): drain to EAGAIN, clear both rung flags that
// target this side, let the other parked calls look, and report whether
// w can stop waiting.
func (e *Endpoint) drained(fd uintptr, w *waiter) bool {
	_, eof, err := sys.DrainSocketBell(int(fd), e.drain[:])
	e.rx.dataRung.Swap(0) // Swap: ordered before the loads below (see endpoint.go)
	e.tx.spaceRung.Swap(0)
	if eof || err != nil {
		e.bellGone()
	}
	e.bump()
	return eof || err != nil || w.ready()
}

// bellGone handles end of file on the bell: the peer side is gone. It
// resets the connection unless the peer had finished with it (file
// comment). No ring: nobody holds the peer's bell.
func (e *Endpoint) bellGone() {
	e.peerGone.Store(true)
	finished := e.reset() || e.rx.fin.Load() != 0 && (e.tx.rdClosed.Load() != 0 || e.tx.fin.Load() != 0)
	if !finished {
		e.tx.rst.Swap(1)
		e.rx.rst.Swap(1)
	}
}

// register returns the netpoller file of the bell, making it on the
// first park with a bell: a dup of the bell, so that until then this
// process's poller never wakes for it.
func (e *Endpoint) register() (syscall.RawConn, error) {
	e.pmu.Lock()
	defer e.pmu.Unlock()
	if e.brc != nil {
		return e.brc, nil
	}
	if e.closed.Load() {
		return nil, net.ErrClosed
	}
	b := e.fs.Bell[e.side]
	if b == nil {
		return nil, errors.New("dring: no bell")
	}
	f, err := dupPollable(b)
	if err != nil {
		return nil, err
	}
	brc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("dring: %w", err)
	}
	if e.woken.Load() {
		_ = f.SetReadDeadline(time.Unix(1, 0)) // see wakeLocal
	}
	e.bf, e.brc = f, brc
	return brc, nil
}

// wakeLocal wakes this process's parked calls after a reset stored here
// (the bell rings only the peer): a past read deadline on the bell's
// netpoller file ends the bell waiter's wait, and gen the others'. The
// deadline stays past: rst never clears, so nobody parks again.
func (e *Endpoint) wakeLocal() {
	e.woken.Store(true) // before pmu: register, made after, sets the deadline itself
	e.pmu.Lock()
	if e.bf != nil {
		_ = e.bf.SetReadDeadline(time.Unix(1, 0))
	}
	e.pmu.Unlock()
	e.bump()
}

// dupPollable duplicates b's descriptor (close-on-exec) into a file in
// Go's netpoller (non-blocking, as the bell's open file description is).
func dupPollable(b *os.File) (*os.File, error) {
	fd, err := fdOf(b)
	if err != nil {
		return nil, err
	}
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dring: dup bell: %w", err)
	}
	f, _, err := sys.PollableFile(nfd, "bell")
	if err != nil {
		return nil, fmt.Errorf("dring: %w", err)
	}
	return f, nil
}
