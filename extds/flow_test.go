package extds

import (
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestRingFullFallsBackToVELO: with a small ring and a reader that starts
// late, a large write fills the ring, continues over VELO, then blocks on
// credits; content survives, and credits come back in batches.
func TestRingFullFallsBackToVELO(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const ring = 16 << 10
	p := newPair(t, WithRingSize(ring), WithEagerWindow(8<<10))
	c, s := p.conns(t)
	defer c.Close()
	defer s.Close()
	total := 1 << 20
	if testenv.Small() {
		total = 256 << 10
	}
	data := randBytes(total, 9)
	errc := make(chan error, 1)
	go func() { _, err := c.Write(data); errc <- err }()
	waitFor(t, 2*time.Second, "writer blocked on credits", func() bool { return p.devA.Stats().CreditWaits > 0 })
	got := make([]byte, 0, total)
	buf := make([]byte, 1000) // many small reads
	reads := 0
	for len(got) < total {
		n, err := s.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		reads++
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if string(got) != string(data) {
		t.Fatal("content mismatch")
	}
	a, b := p.devA.Stats(), p.devB.Stats()
	if a.RingFullFallbacks == 0 || a.TxVELOBytes == 0 || a.TxRMABytes == 0 {
		t.Fatalf("want ring and velo paths and ring-full fallbacks: %+v", a)
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
			c, s := p.conns(t)
			defer c.Close()
			defer s.Close()
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
