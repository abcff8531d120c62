package dring

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// pair makes a connection's files in a temporary directory and attaches
// both sides, as the accepting and the connecting exnd do: the acceptor
// creates (buffer and listener), the client opens (and connects its
// bell), the acceptor accepts its bell and removes the names.
func pair(tb testing.TB, ring int) (a, b *Endpoint) {
	tb.Helper()
	dir := tb.TempDir()
	name := Name("t", 1, uint64(rand.Uint32()))
	fs1, err := Create(dir, name, ring)
	if err != nil {
		tb.Fatal(err)
	}
	fs0, err := Open(dir, name)
	if err != nil {
		fs1.Close()
		tb.Fatal(err)
	}
	if err := fs1.Accept(); err != nil {
		fs0.Close()
		fs1.Close()
		tb.Fatal(err)
	}
	if err := Remove(dir, name); err != nil {
		tb.Fatal(err)
	}
	if b, err = Attach(fs1, 1); err != nil {
		fs0.Close()
		tb.Fatal(err)
	}
	if a, err = Attach(fs0, 0); err != nil {
		b.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestStreamBothWays(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, tc := range []struct {
		ring, total, chunk int
	}{
		{MinRing, 1, 1},
		{MinRing, 100 << 10, 1000},       // wraps many times
		{MinRing, 64 << 10, 3 * MinRing}, // writes larger than the ring
		{1 << 20, 4 << 20, 64 << 10},
	} {
		t.Run(fmt.Sprintf("ring%d/total%d/chunk%d", tc.ring, tc.total, tc.chunk), func(t *testing.T) {
			a, b := pair(t, tc.ring)
			want := make([]byte, tc.total)
			for i := range want {
				want[i] = byte(rand.Uint32())
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for _, dir := range []struct{ w, r *Endpoint }{{a, b}, {b, a}} {
				wg.Add(2)
				go func() {
					defer wg.Done()
					for off := 0; off < len(want); off += tc.chunk {
						if _, err := dir.w.Write(want[off:min(off+tc.chunk, len(want))]); err != nil {
							errs <- err
							return
						}
					}
					dir.w.CloseWrite()
				}()
				go func() {
					defer wg.Done()
					got, err := io.ReadAll(dir.r)
					if err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(got, want) {
						errs <- fmt.Errorf("stream differs: got %d bytes, want %d", len(got), len(want))
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			s, r := a.Counters()
			if s != uint64(tc.total) || r != uint64(tc.total) {
				t.Errorf("counters %d/%d, want %d", s, r, tc.total)
			}
		})
	}
}

func TestEnds(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, tc := range []struct {
		name string
		do   func(a, b *Endpoint)
		want error
	}{
		{"reset wakes a parked reader", func(a, b *Endpoint) { b.Reset() }, ErrReset},
		{"fin is EOF", func(a, b *Endpoint) { b.CloseWrite() }, io.EOF},
		{"close unblocks", func(a, b *Endpoint) { a.Close() }, net.ErrClosed},
		{"forged tail", func(a, b *Endpoint) { b.tx.tail.Store(b.tx.head.Load() + b.ring + 1); b.CloseWrite() }, ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, MinRing)
			done := make(chan error, 1)
			go func() {
				_, err := a.Read(make([]byte, 10))
				done <- err
			}()
			time.Sleep(time.Millisecond) // let it park (the result does not depend on it)
			tc.do(a, b)
			if err := <-done; !errors.Is(err, tc.want) {
				t.Fatalf("read: %v, want %v", err, tc.want)
			}
		})
	}
}

func TestWriteAfterPeerClosedRead(t *testing.T) {
	a, b := pair(t, MinRing)
	b.CloseRead()
	if _, err := a.Write([]byte("x")); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("write: %v, want ErrPeerClosed", err)
	}
}

func TestWriterParksUntilSpace(t *testing.T) {
	a, b := pair(t, MinRing)
	big := make([]byte, 5*MinRing)
	done := make(chan error, 1)
	go func() { _, err := a.Write(big); done <- err }()
	got := 0
	buf := make([]byte, 1000)
	for got < len(big) {
		n, err := b.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestAttachRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		spoil func(f *os.File)
	}{
		{"magic", func(f *os.File) { f.WriteAt([]byte{0}, offMagic) }},
		{"version", func(f *os.File) { f.WriteAt([]byte{9}, offVersion) }},
		{"ring", func(f *os.File) { f.WriteAt([]byte{0, 0x30}, offRing) }},
		{"short file", func(f *os.File) { f.Truncate(HeaderSize + MinRing) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := Name("t", 2, uint64(rand.Uint32()))
			fs, err := Create(dir, name, MinRing)
			if err != nil {
				t.Fatal(err)
			}
			defer Remove(dir, name)
			tc.spoil(fs.Buf)
			if e, err := Attach(fs, 0); !errors.Is(err, ErrCorrupt) {
				if e != nil {
					e.Close()
				}
				t.Fatalf("attach: %v, want ErrCorrupt", err)
			}
		})
	}
}

func FuzzCheckHeader(f *testing.F) {
	good := make([]byte, HeaderSize)
	initHeader(good, MinRing)
	f.Add(good, int64(FileSize(MinRing)))
	f.Add(make([]byte, HeaderSize), int64(0))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		ring, err := checkHeader(b, size)
		if err == nil && (CheckRing(ring) != nil || size != int64(FileSize(ring))) {
			t.Fatalf("accepted ring %d size %d", ring, size)
		}
	})
}

func BenchmarkPingPong64(b *testing.B) {
	x, y := pair(b, DefaultRing)
	msg := make([]byte, 64)
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(y, buf); err != nil {
				return
			}
			if _, err := y.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		x.Write(msg)
		io.ReadFull(x, buf)
	}
}
