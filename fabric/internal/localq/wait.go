package localq

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"
)

// DefaultSpin is how long Wait polls before it sleeps unless a backend
// says otherwise: 20 µs covers a VELO round trip between two running
// goroutines, so a busy ping-pong never parks, while an idle endpoint
// costs only one spin per Wait.
const DefaultSpin = 20 * time.Microsecond

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
// It polls (yielding) for the spin time before it sleeps.
func (w *Waiter) Wait(ctx context.Context) WaitResult {
	if w.closed.Load() {
		return Closed
	}
	if w.ready() {
		return Ready
	}
	start := time.Now()
	for time.Since(start) < w.spin {
		runtime.Gosched()
		if w.ready() {
			return Ready
		}
		if w.closed.Load() {
			return Closed
		}
	}
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
