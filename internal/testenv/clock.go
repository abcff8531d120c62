package testenv

import (
	"sync/atomic"
	"time"
)

// Clock is an injected clock that tests advance by hand; pass its Now
// where a package takes a clock. Safe for concurrent use.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock that reads t0 until advanced.
func NewClock(t0 time.Time) *Clock {
	c := &Clock{}
	c.ns.Store(t0.UnixNano())
	return c
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
