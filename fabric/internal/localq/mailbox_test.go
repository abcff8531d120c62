package localq

import (
	"testing"

	"github.com/exn-project/exn/fabric"
)

// TestMailbox checks order, copying, wrap-around, the length mirror, the
// space channel and Close.
func TestMailbox(t *testing.T) {
	var mb Mailbox
	mb.Init(3)
	src := fabric.Addr{Node: 1, VPID: 2}
	put := func(tag uint32) {
		var m fabric.Message
		m.Tag, m.Len = fabric.Tag(tag), 1
		m.Data[0] = byte(tag)
		mb.PutLocked(src, &m)
	}
	var out [2]fabric.Message
	for round := 0; round < 4; round++ { // wraps the 3-slot ring
		put(uint32(2 * round))
		put(uint32(2*round + 1))
		if got := mb.Length().Load(); got != 2 {
			t.Fatalf("round %d: length %d, want 2", round, got)
		}
		k, bytes := mb.TakeLocked(out[:])
		if k != 2 || bytes != 2 {
			t.Fatalf("round %d: took %d msgs %d bytes, want 2, 2", round, k, bytes)
		}
		for i := 0; i < k; i++ {
			want := byte(2*round + i)
			if out[i].Peer != src || out[i].Data[0] != want || uint32(out[i].Tag) != uint32(want) {
				t.Fatalf("round %d msg %d: %+v, want tag/data %d from %v", round, i, out[i].Peer, want, src)
			}
		}
	}
	sp := mb.SpaceLocked()
	mb.WakeLocked()
	select {
	case <-sp:
	default:
		t.Fatal("WakeLocked did not close the space channel")
	}
	put(9)
	mb.CloseLocked()
	if !mb.ClosedLocked() || mb.NLocked() != 0 || mb.Length().Load() != 0 {
		t.Fatalf("after close: closed %v n %d length %d", mb.ClosedLocked(), mb.NLocked(), mb.Length().Load())
	}
}
