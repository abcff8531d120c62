package extds

import (
	"io"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestRingFull: with a small ring and a reader that starts late, a large
// write fills the ring and waits for ring credits instead of going on as
// VELO fragments (at most its last ringFullVELOMax bytes may); content
// survives, and credits come back in batches. Writes of at most
// ringFullVELOMax bytes above the threshold still go over VELO while the
// ring is full, until the eager credit runs out.
func TestRingFull(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const ring = 16 << 10
	p := newPair(t, WithRingSize(ring), WithEagerWindow(8<<10))
	c, s := p.openConns(t)
	total := 1 << 20
	if testenv.Small() {
		total = 256 << 10
	}
	data := randBytes(total, 9)
	errc := make(chan error, 1)
	go func() { _, err := c.Write(data); errc <- err }()
	testenv.Eventually(t, "writer blocked on credits", 2*time.Second, func() bool { return p.devA.Stats().CreditWaits > 0 })
	reads := receive(t, s, 1000, data, errc, "") // many small reads
	a, b := p.devA.Stats(), p.devB.Stats()
	if a.RingFullFallbacks > 1 || a.TxVELOBytes > ringFullVELOMax || a.TxRMABytes+a.TxVELOBytes != uint64(total) {
		t.Fatalf("a large write went over VELO beyond its tail: %+v", a)
	}
	// Batching: one RMA_AVAIL per quarter of ring or window, far fewer
	// than reads.
	maxMsgs := uint64(total/(8<<10/4)) + 4
	if b.CreditMsgs == 0 || b.CreditMsgs > maxMsgs || b.CreditMsgs*4 > uint64(reads) {
		t.Fatalf("credit messages %d for %d reads of %d bytes (max %d)", b.CreditMsgs, reads, total, maxMsgs)
	}
	if b.CreditBytes > uint64(total) {
		t.Fatalf("returned %d credit bytes for %d", b.CreditBytes, total)
	}

	// Ring full, short writes above the threshold: VELO while eager
	// credit lasts (8 KiB: four 2000-byte writes), then the writer waits.
	// A fresh connection, so the ring is all free to begin with.
	c, s = p.conns(t)
	defer c.Close()
	defer s.Close()
	small := randBytes(ring+6*2000, 10)
	go func() {
		if _, err := c.Write(small[:ring]); err != nil {
			errc <- err
			return
		}
		for off := ring; off < len(small); off += 2000 {
			if _, err := c.Write(small[off : off+2000]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	testenv.Eventually(t, "ring-full VELO writes", 2*time.Second, func() bool {
		st := p.devA.Stats()
		return st.RingFullFallbacks >= 4 && st.CreditWaits > a.CreditWaits
	})
	receive(t, s, 1000, small, errc, " after ring-full VELO writes")
	if st := p.devA.Stats(); st.TxVELOBytes < a.TxVELOBytes+4*2000 {
		t.Fatalf("ring-full short writes: velo bytes %d, want >= %d", st.TxVELOBytes, a.TxVELOBytes+4*2000)
	}
}

func TestZCopy(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	size := 3<<20 + 123 // > zcChunk: several GETs / sinks
	if testenv.Small() {
		size = zcChunk + 4567
	}
	for _, mode := range []ZCopyMode{ZCopyRead, ZCopyWrite} {
		t.Run(map[ZCopyMode]string{ZCopyRead: "read", ZCopyWrite: "write"}[mode], func(t *testing.T) {
			p := newPair(t, WithZCopy(mode, 4096))
			c, s := p.openConns(t)
			buf, err := c.RegisteredBuffer(size + 10)
			if err != nil {
				t.Fatal(err)
			}
			data := randBytes(size+10, uint64(size+10)) // what transfer sends
			copy(buf.Bytes(), data)
			// small BCopy, ZCopy from offset 10, small BCopy: order kept
			write := func(b []byte) (int, error) {
				switch len(b) {
				case 10:
					return c.Write(b)
				case size:
					return c.WriteBuffer(buf, 10, size)
				}
				return c.Write(b)
			}
			transfer(t, c, s, []int{10, size}, write)
			if _, err := c.Write([]byte("tail")); err != nil {
				t.Fatal(err)
			}
			tail := make([]byte, 4)
			if _, err := s.Read(tail); err != nil || string(tail) != "tail" {
				t.Fatalf("tail %q %v", tail, err)
			}
			st := p.devA.Stats()
			if st.TxZCopyBytes != uint64(size) {
				t.Fatalf("zcopy bytes %d, want %d", st.TxZCopyBytes, size)
			}
			if mode == ZCopyRead && p.devB.Stats().ZCopyReads == 0 || mode == ZCopyWrite && st.ZCopyWrites != 1 {
				t.Fatalf("zcopy counters: client %+v server %+v", st, p.devB.Stats())
			}
			if err := buf.Release(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPutsInFlightBound: with a ring far larger than maxPutsInFlight
// small chunks, small writes stop PUTting once that many are outstanding
// and go on over VELO (then wait for eager credit), so the peer's mailbox
// never holds more than about maxPutsInFlight RMA_INFOs of one
// connection; content survives.
func TestPutsInFlightBound(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const size = 1000 // above the threshold: one PUT each
	p := newPair(t, WithRingSize(1<<20), WithEagerWindow(16<<10))
	c, s := p.openConns(t)
	const n = 300 // > maxPutsInFlight; 300 KB, far below the ring
	if maxPutsInFlight >= n {
		t.Fatalf("test needs more than maxPutsInFlight (%d) writes", maxPutsInFlight)
	}
	data := randBytes(n*size, 11)
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < len(data); off += size {
			if _, err := c.Write(data[off : off+size]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	testenv.Eventually(t, "writes past the PUT bound", 2*time.Second, func() bool { return p.devA.Stats().RingFullFallbacks > 0 })
	if st := p.devA.Stats(); st.RMAPuts > maxPutsInFlight {
		t.Fatalf("%d PUTs outstanding, bound %d", st.RMAPuts, maxPutsInFlight)
	}
	receive(t, s, 64<<10, data, errc, "")
}

// receive reads len(want) bytes from r in reads of at most chunk bytes,
// then takes the writer's result from errc, and fails t on an error or
// if the bytes are not want (the message ends in after). It returns how
// many reads it took.
func receive(t testing.TB, r io.Reader, chunk int, want []byte, errc <-chan error, after string) (reads int) {
	t.Helper()
	got := make([]byte, 0, len(want))
	buf := make([]byte, chunk)
	for len(got) < len(want) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		reads++
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatal("content mismatch" + after)
	}
	return reads
}
