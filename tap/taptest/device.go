package taptest

import (
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/exn-project/exn/tap"
)

// QueueLen is the depth of each direction's queue.
const QueueLen = 1024

// Device is an in-memory tap.Device. The test plays the host: Inject
// hands the device a frame for Read (host → engine), and Written yields
// what the engine wrote (engine → host). Read, Write and Close have the
// real TAP's semantics, including batching, short-buffer drops, Write's
// length checks and net.ErrClosed.
type Device struct {
	name string
	mtu  int

	in     chan []byte
	out    chan []byte
	closed chan struct{}
	once   sync.Once

	c tap.Counters
}

var _ tap.Device = (*Device)(nil)

// New returns a device with the given name and MTU (0 means
// tap.DefaultMTU).
func New(name string, mtu int) *Device {
	if mtu == 0 {
		mtu = tap.DefaultMTU
	}
	return &Device{
		name:   name,
		mtu:    mtu,
		in:     make(chan []byte, QueueLen),
		out:    make(chan []byte, QueueLen),
		closed: make(chan struct{}),
	}
}

// Inject queues a copy of frame for Read, as if the host's kernel sent it.
// Any length is accepted, so tests can exercise short buffers. It blocks
// while QueueLen frames are queued, and returns net.ErrClosed once the
// device is closed.
func (d *Device) Inject(frame []byte) error {
	select {
	case <-d.closed:
		return net.ErrClosed
	default:
	}
	select {
	case d.in <- append([]byte(nil), frame...):
		return nil
	case <-d.closed:
		return net.ErrClosed
	}
}

// Written returns the channel of frames the engine wrote, each a copy the
// receiver owns, in write order. It is never closed; select on it with a
// timeout. Write blocks while QueueLen frames are undrained.
func (d *Device) Written() <-chan []byte { return d.out }

// Name implements tap.Device.
func (d *Device) Name() string { return d.name }

// MTU implements tap.Device.
func (d *Device) MTU() int { return d.mtu }

// Stats returns the counters, with the same meaning as (*tap.TAP).Stats.
func (d *Device) Stats() tap.Stats { return d.c.Snapshot() }

func (d *Device) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "tap", Addr: tap.Addr(d.name), Err: err}
}

func (d *Device) isClosed() bool {
	select {
	case <-d.closed:
		return true
	default:
		return false
	}
}

// Read implements tap.Device.
func (d *Device) Read(bufs [][]byte, sizes []int) (int, error) {
	want := min(len(bufs), len(sizes))
	if want == 0 {
		return 0, nil
	}
	for _, b := range bufs[:want] {
		if len(b) == 0 {
			return 0, d.opErr("read", io.ErrShortBuffer)
		}
	}
	if d.isClosed() {
		return 0, d.opErr("read", net.ErrClosed)
	}
	n := 0
	for n < want {
		var f []byte
		if n == 0 {
			select {
			case f = <-d.in:
			case <-d.closed:
				return 0, d.opErr("read", net.ErrClosed)
			}
		} else {
			select {
			case f = <-d.in:
			default:
				return n, nil
			}
		}
		if len(f) > len(bufs[n]) {
			d.c.ShortBuffer.Add(1) // dropped; with n == 0 Read blocks on, as the real TAP does
			continue
		}
		sizes[n] = copy(bufs[n], f)
		d.c.RxFrames.Add(1)
		d.c.RxBytes.Add(uint64(len(f)))
		n++
	}
	return n, nil
}

// Write implements tap.Device.
func (d *Device) Write(frames [][]byte) (int, error) {
	if d.isClosed() {
		return 0, d.opErr("write", net.ErrClosed)
	}
	maxLen := tap.FrameSize(d.mtu)
	for i, f := range frames {
		if len(f) < tap.HeaderLen || len(f) > maxLen {
			d.c.TxErrors.Add(1)
			return i, d.opErr("write", fmt.Errorf("frame of %d bytes not in %d..%d: %w", len(f), tap.HeaderLen, maxLen, tap.ErrFrameSize))
		}
		select {
		case d.out <- append([]byte(nil), f...):
			d.c.TxFrames.Add(1)
			d.c.TxBytes.Add(uint64(len(f)))
		case <-d.closed:
			return i, d.opErr("write", net.ErrClosed)
		}
	}
	return len(frames), nil
}

// Close implements tap.Device. Queued frames are discarded.
func (d *Device) Close() error {
	d.once.Do(func() { close(d.closed) })
	return nil
}
