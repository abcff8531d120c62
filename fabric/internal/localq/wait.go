package localq

import (
	"context"
	"sync/atomic"
	"time"
)

// DefaultSpin is how long Wait polls before it parks unless a backend
// says otherwise: not at all. In one process the producer and the
// consumer are goroutines, and a spin that does not yield keeps a
// producer queued on the same P from running at all (in-process VELO
// ping-pong p50 rose from 0.3 µs to 31 µs with a 20 µs spin on a loaded
// host), while one that yields (runtime.Gosched) keeps the goroutine on
// the global run queue, where the scheduler finds it before it polls
// the network. Parking on a channel is a direct goroutine hand-off, and
// the runtime's own spinning Ms already look for the readied goroutine
// before a thread sleeps (docs/wakeup.md has the measurements).
const DefaultSpin = 0

// WaitResult says why Wait returned.
type WaitResult uint8

const (
	// Ready: something may be ready (wake-ups may be spurious).
	Ready WaitResult = iota
	// Closed: the endpoint is closed.
	Closed
	// Cancelled: ctx is done; ctx.Err() says why.
	Cancelled
)

// Waiter is the contract's spin-then-sleep Wait for one endpoint. The
// zero value is unusable; call Init once, before the endpoint is shared.
type Waiter struct {
	sleeping atomic.Bool   // the consumer is (about to be) parked
	wake     chan struct{} // capacity 1
	spin     time.Duration
	ready    func() bool
	closed   *atomic.Bool
	done     <-chan struct{}
}

// Init sets the spin time, the readiness check (lock-free: it runs in the
// spin loop), the endpoint's closed flag and the channel Close closes.
func (w *Waiter) Init(spin time.Duration, ready func() bool, closed *atomic.Bool, done <-chan struct{}) {
	w.wake = make(chan struct{}, 1)
	w.spin, w.ready, w.closed, w.done = spin, ready, closed, done
}

// Signal wakes the consumer if it sleeps in Wait. Call it after the item
// was made visible to the readiness check.
func (w *Waiter) Signal() {
	if w.sleeping.Load() {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Wait blocks until ready() may hold, the endpoint closes or ctx is done.
// It polls for the spin time, without yielding, before it parks.
func (w *Waiter) Wait(ctx context.Context) WaitResult {
	if w.closed.Load() {
		return Closed
	}
	if w.ready() {
		return Ready
	}
	for start := time.Now(); time.Since(start) < w.spin; {
		if w.ready() {
			return Ready
		}
		if w.closed.Load() {
			return Closed
		}
	}
	return w.Park(ctx)
}

// Park is the sleeping half of Wait, for a backend that spins its own way
// first (ofi drives progress): it publishes sleeping, re-checks ready and
// parks until a Signal, Close or ctx.
func (w *Waiter) Park(ctx context.Context) WaitResult {
	w.sleeping.Store(true)
	defer w.sleeping.Store(false)
	// Re-check after publishing sleeping: a producer that queued before
	// seeing the flag is caught here; one that queues after sends a wake.
	if w.ready() {
		return Ready
	}
	select {
	case <-w.wake:
		return Ready
	case <-w.done:
		return Closed
	case <-ctx.Done():
		return Cancelled
	}
}
