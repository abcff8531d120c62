package taplink

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/internal/vnet"
	"github.com/exn-project/exn/tap"
)

// timeout bounds every wait for the reader or the engine.
const timeout = 10 * time.Second

// fakeDev is a tap.Device (and, with vnet set, a tap.OffloadDevice)
// that the test drives: frames sent on in are read one at a time, with
// their header; readErr makes every Read fail; writes are recorded, and
// those numbered in refuse are refused.
type fakeDev struct {
	in      chan inFrame
	readErr error
	vnet    int
	refuse  map[int]bool
	discard bool // record nothing (the allocation test)

	done      chan struct{}
	closeOnce sync.Once

	mu      sync.Mutex
	nw      int
	written []inFrame
}

type inFrame struct {
	b []byte
	h tap.VnetHdr
}

var errRefused = errors.New("fake: frame refused")

func newFakeDev() *fakeDev {
	return &fakeDev{in: make(chan inFrame, 16), done: make(chan struct{})}
}

func (d *fakeDev) Read(bufs [][]byte, sizes []int) (int, error) { return d.ReadVnet(bufs, sizes, nil) }

func (d *fakeDev) ReadVnet(bufs [][]byte, sizes []int, hdrs []tap.VnetHdr) (int, error) {
	select {
	case <-d.done:
		return 0, net.ErrClosed
	default:
	}
	if d.readErr != nil {
		return 0, d.readErr
	}
	select {
	case f := <-d.in:
		sizes[0] = copy(bufs[0], f.b)
		if hdrs != nil {
			hdrs[0] = f.h
		}
		return 1, nil
	case <-d.done:
		return 0, net.ErrClosed
	}
}

func (d *fakeDev) Write(frames [][]byte) (int, error) { return d.WriteVnet(frames, nil) }

func (d *fakeDev) WriteVnet(frames [][]byte, hdrs []tap.VnetHdr) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, f := range frames {
		select {
		case <-d.done:
			return i, net.ErrClosed
		default:
		}
		k := d.nw
		d.nw++
		if d.refuse[k] {
			return i, errRefused
		}
		if d.discard {
			continue
		}
		var h tap.VnetHdr
		if i < len(hdrs) {
			h = hdrs[i]
		}
		d.written = append(d.written, inFrame{append([]byte(nil), f...), h})
	}
	return len(frames), nil
}

func (d *fakeDev) Name() string  { return "fake" }
func (d *fakeDev) MTU() int      { return 1500 }
func (d *fakeDev) Offloads() int { return d.vnet }
func (d *fakeDev) Close() error {
	d.closeOnce.Do(func() { close(d.done) })
	return nil
}

var _ tap.OffloadDevice = (*fakeDev)(nil)

// fakeEngine lends heap buffers and records what is transmitted. With
// block, Lend waits for ctx (an engine with every slot in flight).
type fakeEngine struct {
	block bool
	lent  atomic.Int64
	sent  chan inFrame // frames transmitted, with their Offload as a header
}

func newFakeEngine() *fakeEngine { return &fakeEngine{sent: make(chan inFrame, 64)} }

func (e *fakeEngine) Lend(ctx context.Context, bufs [][]byte, wait bool) (int, error) {
	if e.block {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	for i := range bufs {
		bufs[i] = make([]byte, 2048)
	}
	e.lent.Add(int64(len(bufs)))
	return len(bufs), nil
}

func (e *fakeEngine) TransmitLentOffload(ctx context.Context, frames [][]byte, offs []exn.Offload) (int, error) {
	for i, f := range frames {
		var o exn.Offload
		if i < len(offs) {
			o = offs[i]
		}
		e.sent <- inFrame{append([]byte(nil), f...), tap.VnetHdr(o)}
		e.lent.Add(-1)
	}
	return len(frames), nil
}

func (e *fakeEngine) Return(bufs [][]byte) { e.lent.Add(-int64(len(bufs))) }

// TestCloseUnblocks: Close returns, with the reader gone and every lent
// buffer back, whether the reader waits in the device's Read (an idle
// TAP) or in Lend (no free slot); later calls see the Link closed.
func TestCloseUnblocks(t *testing.T) {
	for _, block := range []bool{false, true} {
		name := map[bool]string{false: "in Read", true: "in Lend"}[block]
		t.Run(name, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			dev, eng := newFakeDev(), newFakeEngine()
			eng.block = block
			l := New(dev, Config{})
			if err := l.Start(eng); err != nil {
				t.Fatal(err)
			}
			if err := l.Start(eng); err == nil {
				t.Fatal("second Start succeeded")
			}
			time.Sleep(10 * time.Millisecond) // let the reader block
			closed := make(chan error, 1)
			go func() { closed <- l.Close() }()
			if err := testenv.Within(t, "Close", closed, timeout); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if n := eng.lent.Load(); n != 0 {
				t.Fatalf("%d buffers still lent after Close", n)
			}
			if err := l.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if err := l.Start(eng); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Start after Close: %v, want net.ErrClosed", err)
			}
			if err := l.DeliverFrames([][]byte{make([]byte, 60)}); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("DeliverFrames after Close: %v, want net.ErrClosed", err)
			}
		})
	}
	t.Run("never started", func(t *testing.T) {
		dev := newFakeDev()
		if err := New(dev, Config{}).Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-dev.done:
		default:
			t.Fatal("Close did not close the device")
		}
	})
}

// TestReadErrorsFatal: a device whose reads only fail stops the reader
// after MaxReadErrors of them, reported once through Config.Fatal, with
// every lent buffer given back.
func TestReadErrorsFatal(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	dev, eng := newFakeDev(), newFakeEngine()
	dev.readErr = errors.New("fake: read failed")
	fatal := make(chan error, 2)
	l := New(dev, Config{Fatal: func(err error) { fatal <- err }})
	if err := l.Start(eng); err != nil {
		t.Fatal(err)
	}
	err := testenv.Within(t, "Fatal", fatal, timeout)
	if !errors.Is(err, dev.readErr) || !strings.Contains(err.Error(), "100 errors in a row") {
		t.Fatalf("Fatal(%v)", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := eng.lent.Load(); n != 0 {
		t.Fatalf("%d buffers still lent", n)
	}
	select {
	case err := <-fatal:
		t.Fatalf("Fatal called again: %v", err)
	default:
	}
}

// TestDeliverSkipsRefused: a frame the device refuses is skipped, the
// rest of the batch written, and the first refusal returned; with
// headers, each written frame keeps its own header.
func TestDeliverSkipsRefused(t *testing.T) {
	frames := [][]byte{frame(2, 1, 60, 0), frame(2, 1, 61, 1), frame(2, 1, 62, 2), frame(2, 1, 63, 3)}
	offs := []exn.Offload{{HdrLen: 10}, {HdrLen: 11}, {HdrLen: 12}, {HdrLen: 13}}
	for _, vnetOn := range []bool{false, true} {
		dev := newFakeDev()
		dev.refuse = map[int]bool{1: true, 3: true}
		if vnetOn {
			dev.vnet = 1
		}
		l := New(dev, Config{})
		var err error
		if vnetOn {
			err = l.DeliverFramesOffload(frames, offs)
		} else {
			err = l.DeliverFrames(frames)
		}
		if !errors.Is(err, errRefused) {
			t.Fatalf("vnet %v: err %v, want the refusal", vnetOn, err)
		}
		if len(dev.written) != 2 || !bytes.Equal(dev.written[0].b, frames[0]) || !bytes.Equal(dev.written[1].b, frames[2]) {
			t.Fatalf("vnet %v: wrote %d frames, want frames 0 and 2", vnetOn, len(dev.written))
		}
		if vnetOn && (dev.written[0].h != tap.VnetHdr(offs[0]) || dev.written[1].h != tap.VnetHdr(offs[2])) {
			t.Fatalf("headers %+v %+v, want %+v %+v", dev.written[0].h, dev.written[1].h, offs[0], offs[2])
		}
	}
}

// TestOffloadHeaders: on a device with virtio-net headers, Offload asks
// for every offload, the header read with a frame reaches the engine as
// its exn.Offload, and DeliverFramesOffload writes offs as headers. On a
// plain device Offload is 0 and DeliverFramesOffload refuses.
func TestOffloadHeaders(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	dev, eng := newFakeDev(), newFakeEngine()
	dev.vnet = 0x7f
	l := New(dev, Config{})
	if got, want := l.Offload(), uint8(exn.CapCsum|exn.CapTSO|exn.CapUSO); got != want {
		t.Fatalf("Offload = %#x, want %#x", got, want)
	}
	if err := l.Start(eng); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hdr := tap.VnetHdr{Flags: vnet.NeedsCsum, CsumStart: 34, CsumOffset: 16}
	f := frame(2, 1, 100, 7)
	dev.in <- inFrame{f, hdr}
	got := testenv.Within(t, "transmit", eng.sent, timeout)
	if !bytes.Equal(got.b, f) || got.h != hdr {
		t.Fatalf("engine got %d bytes with %+v, want %d with %+v", len(got.b), got.h, len(f), hdr)
	}
	if err := l.DeliverFramesOffload([][]byte{f}, []exn.Offload{exn.Offload(hdr)}); err != nil {
		t.Fatal(err)
	}
	if len(dev.written) != 1 || dev.written[0].h != hdr {
		t.Fatalf("written %+v", dev.written)
	}

	plain := New(newFakeDev(), Config{})
	defer plain.Close()
	if plain.Offload() != 0 {
		t.Fatalf("Offload on a plain device = %#x", plain.Offload())
	}
	if err := plain.DeliverFramesOffload([][]byte{f}, []exn.Offload{{}}); !errors.Is(err, errNoVnet) {
		t.Fatalf("DeliverFramesOffload on a plain device: %v", err)
	}
}

// TestDeliverNoAlloc: the write path allocates nothing per batch.
func TestDeliverNoAlloc(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	dev := newFakeDev()
	dev.vnet, dev.discard = 1, true
	l := New(dev, Config{})
	frames := [][]byte{frame(2, 1, 60, 0), frame(2, 1, 1500, 1)}
	offs := make([]exn.Offload, len(frames))
	if n := testing.AllocsPerRun(100, func() { l.DeliverFrames(frames) }); n != 0 {
		t.Errorf("DeliverFrames: %v allocations", n)
	}
	if n := testing.AllocsPerRun(100, func() { l.DeliverFramesOffload(frames, offs) }); n != 0 {
		t.Errorf("DeliverFramesOffload: %v allocations", n)
	}
}
