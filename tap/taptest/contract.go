package taptest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/tap"
)

// Harness connects RunContract to one fresh device and its host side.
type Harness struct {
	// Dev is the device under test, open and idle.
	Dev tap.Device
	// HostSend makes the host side emit one frame whose bytes contain
	// payload, which Dev.Read must then return. It must not block.
	HostSend func(payload []byte) error
	// Frame returns a frame that, written with Dev.Write, the host side
	// accepts and reports to HostRecv as payload.
	Frame func(payload []byte) []byte
	// HostRecv returns the next payload the host side accepted, waiting at
	// most timeout.
	HostRecv func(timeout time.Duration) ([]byte, error)
}

// Stater is implemented by devices with counters (*tap.TAP, *Device).
type Stater interface{ Stats() tap.Stats }

const contractTimeout = 5 * time.Second

// RunContract runs the tap.Device contract as subtests; newHarness is
// called once per subtest and must arrange its own cleanup with t.Cleanup.
// The host side may emit unrelated frames (IPv6 router solicitations, say):
// the contract looks only for frames carrying its payloads.
func RunContract(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Run("ReadOne", func(t *testing.T) {
		h := newHarness(t)
		p := payload(1, 64)
		mustSend(t, h, p)
		readPayloads(t, h.Dev, 8, [][]byte{p})
	})
	t.Run("ReadBatch", func(t *testing.T) {
		h := newHarness(t)
		var ps [][]byte
		for i := range 8 {
			p := payload(10+i, 100)
			ps = append(ps, p)
			mustSend(t, h, p)
		}
		// All eight are queued before Read: one call must drain them.
		bufs, sizes := newBufs(h.Dev, 32)
		n, err := readTimeout(t, h.Dev, bufs, sizes)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		got := matching(bufs[:n], sizes[:n], ps)
		if len(got) != len(ps) {
			t.Fatalf("one Read returned %d frames with %d of %d queued payloads; want a full batch", n, len(got), len(ps))
		}
		for i := range got {
			if got[i] != i {
				t.Fatalf("batch out of order: %v", got)
			}
		}
	})
	t.Run("Write", func(t *testing.T) {
		h := newHarness(t)
		ps := [][]byte{payload(30, 40), payload(31, 1000), payload(32, 8)}
		frames := make([][]byte, len(ps))
		for i, p := range ps {
			frames[i] = h.Frame(p)
		}
		if n, err := h.Dev.Write(frames); n != len(frames) || err != nil {
			t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(frames))
		}
		for i, p := range ps {
			got, err := h.HostRecv(contractTimeout)
			if err != nil {
				t.Fatalf("host receive %d: %v", i, err)
			}
			if !bytes.Equal(got, p) {
				t.Fatalf("host received %q; want %q", got, p)
			}
		}
	})
	t.Run("WriteRefusesBadFrames", func(t *testing.T) {
		h := newHarness(t)
		good := h.Frame(payload(40, 16))
		tests := []struct {
			name   string
			frames [][]byte
			n      int
		}{
			{"runt", [][]byte{make([]byte, tap.HeaderLen-1)}, 0},
			{"oversize in batch", [][]byte{good, make([]byte, tap.FrameSize(h.Dev.MTU())+1), good}, 1},
		}
		for _, tt := range tests {
			n, err := h.Dev.Write(tt.frames)
			if n != tt.n || !errors.Is(err, tap.ErrFrameSize) {
				t.Errorf("%s: Write = %d, %v; want %d, ErrFrameSize", tt.name, n, err, tt.n)
			}
		}
		if _, err := h.HostRecv(contractTimeout); err != nil {
			t.Fatalf("the good frame before the bad one was not delivered: %v", err)
		}
	})
	t.Run("ShortBuffer", func(t *testing.T) {
		h := newHarness(t)
		big, small := payload(50, 400), payload(51, 4)
		mustSend(t, h, big)
		mustSend(t, h, small)
		// 200-byte buffers: the big frame is dropped, the small one read.
		bufs := make([][]byte, 8)
		for i := range bufs {
			bufs[i] = make([]byte, 200)
		}
		readPayloads(t, h.Dev, 8, [][]byte{small}, bufs...)
		if s, ok := h.Dev.(Stater); ok && s.Stats().ShortBuffer == 0 {
			t.Fatalf("ShortBuffer = 0 after a frame longer than its buffer")
		}
	})
	t.Run("ZeroLengthBuffer", func(t *testing.T) {
		h := newHarness(t)
		if _, err := h.Dev.Read([][]byte{{}}, []int{0}); !errors.Is(err, io.ErrShortBuffer) {
			t.Fatalf("Read(zero-length buffer) = %v; want io.ErrShortBuffer", err)
		}
		if n, err := h.Dev.Read(nil, nil); n != 0 || err != nil {
			t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
		}
	})
	t.Run("CloseUnblocksRead", func(t *testing.T) {
		h := newHarness(t)
		done := make(chan error, 1)
		go func() {
			bufs, sizes := newBufs(h.Dev, 4)
			for {
				// Skip any unrelated host frames until Close.
				if _, err := h.Dev.Read(bufs, sizes); err != nil {
					done <- err
					return
				}
			}
		}()
		time.Sleep(50 * time.Millisecond)
		if err := h.Dev.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked Read returned %v; want net.ErrClosed", err)
			}
		case <-time.After(contractTimeout):
			t.Fatal("Close did not unblock Read")
		}
	})
	t.Run("UseAfterClose", func(t *testing.T) {
		h := newHarness(t)
		frame := h.Frame(payload(60, 10))
		if err := h.Dev.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		bufs, sizes := newBufs(h.Dev, 1)
		if _, err := h.Dev.Read(bufs, sizes); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Read after Close = %v; want net.ErrClosed", err)
		}
		if n, err := h.Dev.Write([][]byte{frame}); n != 0 || !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close = %d, %v; want 0, net.ErrClosed", n, err)
		}
		if err := h.Dev.Close(); err != nil {
			t.Errorf("second Close = %v; want nil", err)
		}
	})
}

// payload returns a recognisable payload: a marker with id, padded to n.
func payload(id, n int) []byte {
	p := fmt.Appendf(nil, "exn-contract-%04d|", id)
	for len(p) < n {
		p = append(p, byte('a'+len(p)%26))
	}
	return p[:max(n, len(p))]
}

func mustSend(t *testing.T, h Harness, p []byte) {
	t.Helper()
	if err := h.HostSend(p); err != nil {
		t.Fatalf("host send: %v", err)
	}
}

func newBufs(d tap.Device, n int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, tap.FrameSize(d.MTU()))
	}
	return bufs, make([]int, n)
}

// readTimeout is one Read that fails the test, closing the device to
// unblock it, if nothing arrives in time.
func readTimeout(t *testing.T, d tap.Device, bufs [][]byte, sizes []int) (int, error) {
	t.Helper()
	type result struct {
		n   int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		n, err := d.Read(bufs, sizes)
		ch <- result{n, err}
	}()
	select {
	case r := <-ch:
		return r.n, r.err
	case <-time.After(contractTimeout):
		d.Close()
		<-ch
		t.Fatal("Read returned nothing in time")
		return 0, nil
	}
}

// matching returns, for each frame that contains one of ps, that payload's
// index.
func matching(frames [][]byte, sizes []int, ps [][]byte) []int {
	var idx []int
	for i, f := range frames {
		for j, p := range ps {
			if bytes.Contains(f[:sizes[i]], p) {
				idx = append(idx, j)
			}
		}
	}
	return idx
}

// readPayloads reads until every payload in ps has been seen, in order,
// ignoring unrelated frames.
func readPayloads(t *testing.T, d tap.Device, batch int, ps [][]byte, bufs ...[]byte) {
	t.Helper()
	if bufs == nil {
		bufs, _ = newBufs(d, batch)
	}
	sizes := make([]int, len(bufs))
	next := 0
	deadline := time.Now().Add(contractTimeout)
	for next < len(ps) {
		if time.Now().After(deadline) {
			t.Fatalf("saw %d of %d payloads", next, len(ps))
		}
		n, err := readTimeout(t, d, bufs, sizes)
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		for _, j := range matching(bufs[:n], sizes[:n], ps) {
			if j != next {
				t.Fatalf("payload %d read before %d", j, next)
			}
			next++
		}
	}
}
