package fabnet

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/exn-project/exn/fabric"
)

func seedFrame(typ, flags uint8, a, b fabric.VPID, body ...[]byte) []byte {
	var x []byte
	for _, p := range body {
		x = append(x, p...)
	}
	out := make([]byte, prefixSize, prefixSize+len(x))
	putPrefix(out, len(x), typ, flags, a, b)
	return append(out, x...)
}

// FuzzReadLoop feeds arbitrary bytes to a session's reader, as a peer
// that passed the handshake would send them, with credits, a pending GET
// and a pending PUT in place so every frame type reaches its handler.
// The reader must never panic or hang, must end with an error at the end
// of input, and must never write into a region it was not addressed to
// legitimately: VPID 6's region must stay untouched.
func FuzzReadLoop(f *testing.F) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	n, err := open(Config{Node: 2, Listener: ln, Logger: testLogger(), Peers: map[fabric.NodeID]string{1: "127.0.0.1:1", 2: ln.Addr().String()}})
	if err != nil {
		f.Fatal(err)
	}
	defer n.Close()
	ep5, _ := n.Open(5)
	ep6, _ := n.Open(6)
	r5, _ := ep5.Register(1 << 17)
	r6, _ := ep6.Register(4096)
	for i := range r6.Buf {
		r6.Buf[i] = 0xEE
	}
	desc := func(l uint8) []byte { return u64(fabric.Descriptor{VPID: 5, Len: l}.Encode()) }
	getID, putID := uint64(1)<<32, uint64(1)<<32|1
	seeds := [][]byte{
		seedFrame(tHeartbeat, 0, 0, 0),
		seedFrame(tVELO, 0, 1, 5, desc(3), []byte{1, 2, 3}),
		seedFrame(tCreditReq, 0, 0, 5),
		seedFrame(tGrant, 0, 0, 5, u32(4)),
		seedFrame(tNoVPID, 0, 0, 5),
		seedFrame(tClosed, 0, 0, 5),
		seedFrame(tPutData, fLast|2<<flagShift, 1, 5, u64(9), u64(uint64(r5.NLA)), u32(4), u32(0), []byte{1, 2, 3, 4}),
		seedFrame(tPutData, 0, 1, 5, u64(9), u64(uint64(r5.NLA)), u32(8), u32(0), []byte{1, 2, 3, 4}),
		seedFrame(tPutData, fLast|fAbort, 1, 5, u64(9), u64(uint64(r5.NLA)), u32(8), u32(4)),
		seedFrame(tPutData, fLast, 1, 5, u64(9), u64(uint64(r6.NLA)), u32(4), u32(0), []byte{1, 2, 3, 4}),
		seedFrame(tPutAck, 0, 5, 1, u64(putID)),
		seedFrame(tGetReq, 4<<flagShift, 1, 5, u64(3), u64(uint64(r5.NLA)), u32(100), u32(0)),
		seedFrame(tGetData, fLast, 5, 1, u64(getID), u32(0), make([]byte, 64)),
		seedFrame(tGetData, 0, 5, 1, u64(getID), u32(0), make([]byte, 32)),
		seedFrame(tGetData, fLast|1<<flagShift, 5, 1, u64(getID), u32(0)),
		seedFrame(tGetDone, 0, 1, 5, u64(3)),
		{0, 0, 0, 0x40, tPutData, 0, 0, 0},
	}
	for _, s := range seeds {
		f.Add(s)
	}
	f.Add(bytes.Join(seeds[:6], nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		c1, c2 := net.Pipe()
		// The peer reads everything (replies written directly or by the
		// writer goroutine), and the writer runs as in session.run.
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, c2); close(drained) }()
		defer func() { c2.Close(); <-drained }()
		s := newSession(n, c1, hello{node: 1, version: protoVersion})
		wdone := make(chan struct{})
		go func() { s.writeLoop(); close(wdone) }()
		e5 := n.eps[5].Load()
		if !e5.creditRequest(s) {
			t.Fatal("credit request refused")
		}
		s.tx[5].requested = true
		local := n.lookupRegion(r5.NLA.Region())
		s.alloc(e5, &fabric.RMA{Op: fabric.OpGet, Peer: fabric.Addr{Node: 1, VPID: 5}, Local: r5.NLA, Remote: 1 << 40, Len: 64, Notify: fabric.NotifyResponder}, local)
		s.alloc(e5, &fabric.RMA{Op: fabric.OpPut, Peer: fabric.Addr{Node: 1, VPID: 5}, Local: r5.NLA, Remote: 1 << 40, Len: 64}, local)
		if err := s.readLoop(bufio.NewReader(bytes.NewReader(data))); err == nil {
			t.Fatal("readLoop returned nil at end of input")
		}
		s.kill(nil)
		<-wdone
		s.cleanup()
		for i, b := range r6.Buf {
			if b != 0xEE {
				t.Fatalf("VPID 6's region byte %d written through VPID 5's session", i)
			}
		}
		mb := &e5.mb
		mb.Mu.Lock()
		n := mb.NLocked()
		bad := n > mb.Cap() || mb.reserved < 0 || len(mb.rx) != 0
		var drop [16]fabric.Message
		for mb.NLocked() > 0 {
			mb.TakeLocked(drop[:])
		}
		mb.Mu.Unlock()
		if bad {
			t.Fatalf("mailbox accounting broken: n %d reserved %d rx %d", n, mb.reserved, len(mb.rx))
		}
		var ns [64]fabric.Notification
		for k, _ := ep5.PollNotifications(ns[:]); k > 0; k, _ = ep5.PollNotifications(ns[:]) {
		}
	})
}
