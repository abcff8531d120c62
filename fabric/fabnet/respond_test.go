package fabnet

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// TestResponderNotify checks when the responder of a GET is notified
// (protocol 2): right after its last chunk was written when the requester
// gets a notification of its own (no get-done on the wire), and only on
// the requester's get-done when the responder is the only one notified.
// A get-done for a GET that needs none is a protocol violation.
func TestResponderNotify(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	n, ep := targetEP(t)
	r, _ := ep.Register(4096)
	for i := range r.Buf {
		r.Buf[i] = byte(i)
	}
	f := fakePeer(t, n, 1)
	var ns [4]fabric.Notification
	poll := func() int {
		k, _ := ep.PollNotifications(ns[:])
		return k
	}
	getReq := func(id uint64, notify fabric.Notify) {
		t.Helper()
		f.frame(tGetReq, uint8(notify)<<flagShift, 1, 5, u64(id), u64(uint64(r.NLA+100)), u32(1000), u32(0))
		p, body := f.next(tGetData)
		if binary.LittleEndian.Uint64(body) != id || p.flags&fLast == 0 || p.payloadLen() != 1000 || body[12] != 100 {
			t.Fatalf("get %d answer: flags %#x len %d", id, p.flags, p.payloadLen())
		}
	}
	want := fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: fabric.Addr{Node: 1, VPID: 1}, Len: 1000, Local: fabric.LastFrame(r.NLA+100, 1000)}

	// Completer and responder (what EXT-Eth asks for): notified once the
	// data has left, without a get-done.
	getReq(1, fabric.NotifyCompleter|fabric.NotifyResponder)
	waitUntil(t, "responder notification without get-done", func() bool { return poll() == 1 })
	if ns[0] != want {
		t.Fatalf("responder notification %+v, want %+v", ns[0], want)
	}

	// Responder only: nothing until the get-done.
	getReq(2, fabric.NotifyResponder)
	time.Sleep(50 * time.Millisecond)
	if k := poll(); k != 0 {
		t.Fatalf("responder-only GET notified before get-done: %+v", ns[:k])
	}
	f.frame(tGetDone, 0, 1, 5, u64(2))
	waitUntil(t, "responder notification after get-done", func() bool { return poll() == 1 })
	if ns[0] != want {
		t.Fatalf("responder notification %+v, want %+v", ns[0], want)
	}
	if n.Alive(1) != nil || n.NetStats().BadFrames != 0 {
		t.Fatal("legitimate GETs cost the session")
	}

	// A get-done for GET 1, which needed none: a violation.
	f.frame(tGetDone, 0, 1, 5, u64(1))
	waitUntil(t, "session closed", func() bool { return n.Alive(1) != nil })
	if got := n.NetStats().BadFrames; got != 1 {
		t.Fatalf("BadFrames = %d, want 1", got)
	}
	if k := poll(); k != 0 {
		t.Fatalf("stray notifications: %+v", ns[:k])
	}
}
