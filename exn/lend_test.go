package exn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// lendOne lends one buffer, waiting at most 5 s.
func lendOne(tb testing.TB, e *Engine) []byte {
	tb.Helper()
	return lend(tb, e, 1)[0]
}

// lend lends n buffers, waiting at most 5 s, and fails tb unless it gets
// all n.
func lend(tb testing.TB, e *Engine, n int) [][]byte {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bufs := make([][]byte, n)
	if got, err := e.Lend(ctx, bufs, true); err != nil || got != n {
		tb.Fatalf("Lend: n=%d err=%v", got, err)
	}
	return bufs
}

func TestLendTransmitContent(t *testing.T) {
	a, b := pair(t, Config{MTU: MaxMTU, TxSlots: 4})
	bcast := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	tests := []struct {
		name string
		dst  []byte
		size int
		drop DropReason // DropNone: delivered
	}{
		{"eager-min", b.eng.MAC(), 14, DropNone},
		{"eager", b.eng.MAC(), 480, DropNone},
		{"rendezvous", b.eng.MAC(), 481, DropNone},
		{"rendezvous-max", b.eng.MAC(), 65535 + 14, DropNone},
		{"multicast", bcast, 300, DropNone},
		{"runt", b.eng.MAC(), 13, DropRunt},
		{"self", a.eng.MAC(), 1500, DropSelf},
		{"foreign", []byte{2, 0, 0, 0, 0, 1}, 1500, DropForeignMAC},
	}
	delivered := 0
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := frame(tc.dst, a.eng.MAC(), max(tc.size, 14), uint32(i))[:tc.size]
			buf := lendOne(t, a.eng)
			if len(buf) != a.eng.maxFrame || cap(buf) != a.eng.maxFrame {
				t.Fatalf("lent buffer len %d cap %d, want %d", len(buf), cap(buf), a.eng.maxFrame)
			}
			if s := a.eng.Stats(); s.TxSlotsLent != 1 || s.TxSlotsInUse != 0 {
				t.Fatalf("TxSlotsLent %d, TxSlotsInUse %d with one lent, want 1, 0", s.TxSlotsLent, s.TxSlotsInUse)
			}
			copy(buf, f)
			before := a.eng.Stats().Drops[tc.drop]
			n, err := a.eng.TransmitLent(context.Background(), [][]byte{buf[:tc.size]})
			if n != 1 || err != nil {
				t.Fatalf("TransmitLent: n=%d err=%v", n, err)
			}
			if tc.drop != DropNone {
				if got := a.eng.Stats().Drops[tc.drop]; got != before+1 {
					t.Fatalf("drops[%v] %d, want %d", tc.drop, got, before+1)
				}
				quiet(t, a.eng)
				return
			}
			delivered++
			got := b.link.wait(t, delivered, 5*time.Second)[delivered-1]
			if !bytes.Equal(got, f) {
				t.Fatalf("frame differs: got %d bytes, want %d", len(got), len(f))
			}
			quiet(t, a.eng)
		})
	}
	if a.eng.lent.Load() != 0 {
		t.Errorf("lent count %d after all transmitted", a.eng.lent.Load())
	}
}

// TestLendZeroCopy checks a rendezvous frame is advertised from the slot
// it was read into (that slot's generation moves on), and arrives intact.
func TestLendZeroCopy(t *testing.T) {
	a, b := pair(t, Config{})
	f := frame(b.eng.MAC(), a.eng.MAC(), 4000, 7)
	buf := lendOne(t, a.eng)
	t.Cleanup(func() { a.eng.Return([][]byte{buf}) })
	copy(buf, f)
	slot := a.eng.lentIndex(buf)
	gen := a.eng.tx.slots[slot].gen
	if _, err := a.eng.TransmitLent(context.Background(), [][]byte{buf[:len(f)]}); err != nil {
		t.Fatal(err)
	}
	if g := a.eng.tx.slots[slot].gen; g != gen+1 {
		t.Fatalf("slot %d generation %d -> %d: not the advert's slot", slot, gen, g)
	}
	got := b.link.wait(t, 1, 5*time.Second)[0]
	if !bytes.Equal(got, f) {
		t.Fatal("frame differs")
	}
	quiet(t, a.eng)
}

func TestLendBackPressure(t *testing.T) {
	a, b := pair(t, Config{TxSlots: 2})
	ctx := context.Background()
	bufs := make([][]byte, 4)
	t.Cleanup(func() { a.eng.Return(bufs) })
	if n, err := a.eng.Lend(ctx, bufs, true); n != 2 || err != nil {
		t.Fatalf("Lend of 4 from a pool of 2: n=%d err=%v", n, err)
	}
	if n, err := a.eng.Lend(ctx, bufs[2:], false); n != 0 || err != nil {
		t.Fatalf("Lend without wait from an empty pool: n=%d err=%v", n, err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	n, err := a.eng.Lend(short, bufs[2:], true)
	cancel()
	if n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lend from an empty pool: n=%d err=%v, want deadline", n, err)
	}
	// A waiting Lend gets the slot a TransmitLent frees.
	got := make(chan int, 1)
	go func() {
		n, _ := a.eng.Lend(ctx, bufs[2:3], true)
		got <- n
	}()
	select {
	case <-got:
		t.Fatal("Lend did not wait for a slot")
	case <-time.After(30 * time.Millisecond):
	}
	f := frame(b.eng.MAC(), a.eng.MAC(), 2000, 1)
	copy(bufs[0], f)
	if n, err := a.eng.TransmitLent(ctx, [][]byte{bufs[0][:len(f)]}); n != 1 || err != nil {
		t.Fatalf("TransmitLent: n=%d err=%v", n, err)
	}
	if n := testenv.Within(t, "Lend after the slot was pulled", got, 5*time.Second); n != 1 {
		t.Fatalf("Lend after a slot freed: n=%d", n)
	}
	b.link.wait(t, 1, 5*time.Second)
	a.eng.Return(bufs[1:3])
	quiet(t, a.eng)
	if s := a.eng.Stats(); s.TxSlotWaits == 0 {
		t.Error("TxSlotWaits not counted")
	}
}

func TestLendNotLent(t *testing.T) {
	a, b := pair(t, Config{TxSlots: 4})
	ctx := context.Background()
	bufs := lend(t, a.eng, 3)
	t.Cleanup(func() { a.eng.Return(bufs) })
	f := frame(b.eng.MAC(), a.eng.MAC(), 100, 1)
	for _, buf := range bufs {
		copy(buf, f)
	}
	private := append([]byte(nil), f...)
	tests := []struct {
		name   string
		frames [][]byte
		wantN  int
	}{
		{"private buffer", [][]byte{bufs[0][:100], private}, 1},
		{"already sent", [][]byte{bufs[0][:100]}, 0},
		{"not at slot start", [][]byte{bufs[1][1:100]}, 0},
		{"empty", [][]byte{nil}, 0},
	}
	for _, tc := range tests {
		n, err := a.eng.TransmitLent(ctx, tc.frames)
		if n != tc.wantN || !errors.Is(err, ErrNotLent) {
			t.Errorf("%s: n=%d err=%v, want n=%d ErrNotLent", tc.name, n, err, tc.wantN)
		}
	}
	b.link.wait(t, 1, 5*time.Second)
	// Return ignores what is not lent, and a buffer given back twice.
	a.eng.Return([][]byte{private, bufs[1], bufs[1], bufs[0], nil})
	if n, err := a.eng.TransmitLent(ctx, [][]byte{bufs[1][:100]}); n != 0 || !errors.Is(err, ErrNotLent) {
		t.Errorf("TransmitLent of a returned buffer: n=%d err=%v", n, err)
	}
	a.eng.Return(bufs[2:])
	quiet(t, a.eng)
	if a.eng.lent.Load() != 0 {
		t.Errorf("lent count %d", a.eng.lent.Load())
	}
}

// TestCloseWithLent: Close waits for lent buffers, Lend and TransmitLent
// fail after it, and Return still works and lets Close finish.
func TestCloseWithLent(t *testing.T) {
	a, b := pair(t, Config{TxSlots: 4})
	ctx := context.Background()
	bufs := lend(t, a.eng, 2)
	t.Cleanup(func() { a.eng.Return(bufs) })
	closed := make(chan error, 1)
	go func() { closed <- a.eng.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned with buffers lent")
	case <-time.After(30 * time.Millisecond):
	}
	more := make([][]byte, 1)
	if n, err := a.eng.Lend(ctx, more, true); n != 0 || !errors.Is(err, net.ErrClosed) {
		t.Errorf("Lend after Close: n=%d err=%v", n, err)
	}
	copy(bufs[0], frame(b.eng.MAC(), a.eng.MAC(), 2000, 1))
	if n, err := a.eng.TransmitLent(ctx, [][]byte{bufs[0][:2000]}); n != 0 || !errors.Is(err, net.ErrClosed) {
		t.Errorf("TransmitLent after Close: n=%d err=%v", n, err)
	}
	a.eng.Return(bufs[:1])
	select {
	case <-closed:
		t.Fatal("Close returned with a buffer still lent")
	case <-time.After(30 * time.Millisecond):
	}
	a.eng.Return(bufs[1:])
	if err := testenv.Within(t, "Close after every buffer came back", closed, 5*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestLendBlockedClose: a Lend waiting for a slot wakes with
// net.ErrClosed when the engine closes.
func TestLendBlockedClose(t *testing.T) {
	a, _ := pair(t, Config{TxSlots: 1})
	ctx := context.Background()
	bufs := lend(t, a.eng, 1)
	errc := make(chan error, 1)
	go func() {
		_, err := a.eng.Lend(ctx, make([][]byte, 1), true)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	go func() {
		time.Sleep(20 * time.Millisecond)
		a.eng.Return(bufs)
	}()
	a.eng.Close()
	// Close set closed before the Return, so the waiter either woke on
	// done or took the slot, saw closed and gave it back.
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("blocked Lend: %v, want net.ErrClosed", err)
	}
}

// FuzzTransmitLent: arbitrary frames (each: a length byte pair, a
// destination selector, bytes) read into lent buffers never crash
// TransmitLent, each is sent or dropped and counted exactly once, and no
// slot stays lent.
func FuzzTransmitLent(f *testing.F) {
	f.Add([]byte{0, 60, 0, 1, 2, 3})
	f.Add([]byte{5, 220, 0, 0, 13, 1, 0, 0, 2, 2, 0, 200, 3})
	f.Add([]byte{0xff, 0xff, 0, 0, 0, 2})
	c := mem.NewCluster()
	ns := newNodes(f, c, Config{MTU: 1500, TxSlots: 8}, 1, 2)
	a, b := ns[0], ns[1]
	bcast := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	f.Fuzz(func(t *testing.T, in []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		bufs := make([][]byte, 4)
		n, err := a.eng.Lend(ctx, bufs, true)
		if err != nil {
			t.Fatal(err)
		}
		var frames [][]byte
		for k := 0; k < n && len(in) >= 3; k++ {
			size := int(binary.BigEndian.Uint16(in[0:2])) % (len(bufs[k]) + 1)
			sel := in[2]
			in = in[3:]
			fr := bufs[k][:size]
			clear(fr)
			m := copy(fr, in)
			in = in[m:]
			if size >= 12 {
				switch sel % 4 {
				case 0:
					copy(fr, b.eng.MAC())
				case 1:
					copy(fr, a.eng.MAC())
				case 2:
					copy(fr, bcast)
				}
				copy(fr[6:], a.eng.MAC())
			}
			frames = append(frames, fr)
		}
		a.eng.Return(bufs[len(frames):n])
		before := a.eng.Stats()
		got, err := a.eng.TransmitLent(ctx, frames)
		if got != len(frames) || err != nil {
			t.Fatalf("TransmitLent: %d/%d, %v", got, len(frames), err)
		}
		after := a.eng.Stats()
		var sent, dropped uint64
		for p := range NumProtos {
			sent += after.TxFrames[p] - before.TxFrames[p]
		}
		dropped = after.TotalDrops() - before.TotalDrops()
		if sent+dropped != uint64(len(frames)) {
			t.Fatalf("%d frames: %d sent + %d dropped", len(frames), sent, dropped)
		}
		if l := a.eng.lent.Load(); l != 0 {
			t.Fatalf("%d slots still lent", l)
		}
	})
}
