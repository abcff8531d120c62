package taplink

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/tap"
)

// Limits of the reader.
const (
	// ReadBatch is how many frames the reader takes per wake-up and hands
	// to the engine as one batch; it also holds up to this many empty
	// lent slots between reads.
	ReadBatch = 64
	// MaxReadErrors is how many device read errors in a row stop the
	// reader: a single refused frame is the TAP's to count, a TAP that
	// only fails is dead.
	MaxReadErrors = 100
)

// Engine is the fabric side of a Link; *exn.Engine implements it. The
// reader borrows transmit slots with Lend, fills them from the device and
// passes them on with TransmitLentOffload, or gives them back with
// Return; exn.Engine.Lend states the rules (every lent buffer comes back,
// ctx ends a wait).
type Engine interface {
	Lend(ctx context.Context, bufs [][]byte, wait bool) (int, error)
	TransmitLentOffload(ctx context.Context, frames [][]byte, offs []exn.Offload) (int, error)
	Return(bufs [][]byte)
}

var (
	_ Engine          = (*exn.Engine)(nil)
	_ exn.OffloadLink = (*Link)(nil)
)

// Config configures a Link. The zero value is valid.
type Config struct {
	// Logger receives a debug line for each frame the engine refused
	// from the reader. Nil discards them.
	Logger *slog.Logger
	// Fatal, if set, is called at most once, on the reader goroutine,
	// when the device failed MaxReadErrors reads in a row: the reader has
	// then stopped (it gives its buffers back as it returns) while the
	// engine and the write path go on. It must not block and must not
	// call Close. It is not called on Close.
	Fatal func(err error)
}

// Link joins one tap.Device to one engine: it is the engine's
// exn.OffloadLink (received frames go to the device) and, once started,
// runs the reader that feeds the device's frames to the engine.
//
// Ownership: the Link owns the device from New; Close closes it. The
// caller keeps using the device's read-only methods (Name, MTU, Stats).
//
// Concurrency: DeliverFrames and DeliverFramesOffload are the engine's
// (its receive goroutine); Start, Close and Offload are safe to call from
// any goroutine.
type Link struct {
	dev   tap.Device
	od    tap.OffloadDevice // dev, when it carries virtio-net headers
	log   *slog.Logger
	fatal func(error)

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc // ends the reader's waits; nil before Start

	wg        sync.WaitGroup // the reader
	closeOnce sync.Once
	closeErr  error
}

// New returns a Link on dev that is not yet reading; it takes ownership
// of dev. On a tap.OffloadDevice that took offloads at open (Offloads
// != 0) the Link reads and writes virtio-net headers, and Offload says
// so.
func New(dev tap.Device, cfg Config) *Link {
	l := &Link{dev: dev, log: cfg.Logger, fatal: cfg.Fatal}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if od, ok := dev.(tap.OffloadDevice); ok && od.Offloads() != 0 {
		l.od = od
	}
	return l
}

// Offload is the exn.Config.Offload to build the engine with: on a device
// with virtio-net headers, partial checksums and TCP and UDP super-frames
// (the kernel takes them written to any TAP with a virtio-net header);
// otherwise 0. It does not change after New.
func (l *Link) Offload() uint8 {
	if l.od == nil {
		return 0
	}
	return exn.CapCsum | exn.CapTSO | exn.CapUSO
}

// Start starts the reader, which moves frames from the device into eng
// until Close (or until the device fails, see Config.Fatal). eng should
// be the engine this Link was given to. Start may be called once; after
// Close it returns net.ErrClosed.
func (l *Link) Start(eng Engine) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return net.ErrClosed
	case l.started:
		return errors.New("taplink: start: already started")
	}
	l.started = true
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.wg.Add(1)
	go l.readLoop(ctx, eng)
	return nil
}

// Close stops the reader and closes the device, which makes a blocked
// Read, Lend or TransmitLentOffload of the reader return and later
// DeliverFrames calls fail with net.ErrClosed. It returns once the reader
// has exited and given back every buffer the engine lent it, with the
// device's Close error. Call it before the engine's Close, which waits
// for those buffers. It is idempotent; a concurrent call waits for the
// first.
func (l *Link) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		cancel := l.cancel
		l.mu.Unlock()
		if cancel != nil {
			cancel() // unblocks a Lend or Transmit waiting on back-pressure
		}
		// Closing the device unblocks the reader's Read, which may be
		// filling buffers lent by the engine: the reader then gives them
		// back.
		l.closeErr = l.dev.Close()
		l.wg.Wait()
	})
	return l.closeErr
}
