package shm

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Option configures Open.
type Option func(*options) error

type options struct {
	slots int
	depth int
	dir   string
	log   *slog.Logger
	// noBell makes every VPID of the NIC wait on its futex, as if its
	// doorbell FIFO could not be made (tests of the fallback).
	noBell bool
	// noSpin switches off Wait's spin (benchmarks and tests of the
	// sleep itself).
	noSpin bool
	// backstop is the longest one futex sleep of a VPID without a FIFO
	// (waitSlice). bellBackstop, zero outside tests, is a read deadline
	// on the FIFO sleep: tests set one to prove a wake-up came from a
	// producer, or from the deadline.
	backstop, bellBackstop time.Duration
}

// applyOptions applies opts, in order, over the defaults.
func applyOptions(opts []Option) (options, error) {
	o := options{slots: DefaultSlots, depth: fabric.DefaultNotifyDepth, dir: "/dev/shm", log: slog.Default(), backstop: waitSlice}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// WithSlots sets the number of 128-byte slots in each VELO mailbox this
// node opens: a power of two in 2..65536. Default DefaultSlots.
func WithSlots(n int) Option {
	return pow2Option(n, validSlots, minSlots, maxSlots, "%d mailbox slots", func(o *options) { o.slots = n })
}

// WithNotifyDepth sets each notification queue's depth: a power of two
// from fabric.DefaultNotifyDepth to 262144. Default fabric.DefaultNotifyDepth.
func WithNotifyDepth(n int) Option {
	return pow2Option(n, validDepth, minNotifyDepth, maxNotifyDepth, "notify depth %d", func(o *options) { o.depth = n })
}

// pow2Option is an Option that applies set if valid(n), and otherwise
// fails with fabric.ErrInvalid: n, described by what (a format with one
// %d for n), is not a power of two in lo..hi.
func pow2Option(n int, valid func(int) bool, lo, hi int, what string, set func(*options)) Option {
	return func(o *options) error {
		if !valid(n) {
			return fmt.Errorf("shm: %s: want a power of two in %d..%d: %w", fmt.Sprintf(what, n), lo, hi, fabric.ErrInvalid)
		}
		set(o)
		return nil
	}
}

// WithDir puts the fabric's files in dir instead of /dev/shm. Every node
// of a fabric must use the same directory, on a tmpfs for speed.
func WithDir(dir string) Option {
	return func(o *options) error {
		if dir == "" {
			return fmt.Errorf("shm: empty directory: %w", fabric.ErrInvalid)
		}
		o.dir = dir
		return nil
	}
}

// WithLogger sets the logger for faults (rate-limited) and lifecycle
// events. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l != nil {
			o.log = l
		}
		return nil
	}
}
