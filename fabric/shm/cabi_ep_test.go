package shm

// Cross-language conformance of the data path (see cabi_test.go for the
// C peer and its harness): VELO and RMA both ways between the C peer and
// Go endpoints, forged input read by each side, and a Go sender parked
// on a C consumer's space bell.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
)

// TestCABIVELO: VELO both ways between the C peer (1:10) and Go
// endpoints on another node (2:1) and on its own node (1:1), with every
// consumer asleep before the message arrives, so each delivery was a
// wake-up by a producer in the other language; then 200 echoes.
func TestCABIVELO(t *testing.T) {
	s := newCABI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := s.c
	cAddr := fabric.Addr{Node: 1, VPID: 10}

	// Go → C, C asleep in poll() on its FIFO.
	for _, ep := range []fabric.Endpoint{s.ep2, s.ep1} {
		before := c.stats()["bellsleeps"]
		c.send("recv 10 20000")
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		sendOne(t, ctx, ep, cAddr, 5, "hello from go")
		from, tag, p := c.recv2()
		if d := time.Since(start); d > promptWake {
			t.Errorf("c woke %v after the send: not by the ring", d)
		}
		if from != ep.Addr() || tag != 5 || string(p) != "hello from go" {
			t.Errorf("c got %v tag %d %q, want %v tag 5", from, tag, p, ep.Addr())
		}
		if st := c.stats(); st["bellsleeps"] == before {
			t.Errorf("c did not sleep on its FIFO: %v", st)
		}
	}
	if ws := wakeStats(t, s.node2); ws.BellRings == 0 {
		t.Errorf("go producer never rang the C consumer's FIFO: %+v", ws)
	}

	// C → Go, Go asleep (netpoller or futex: both are rung by C).
	for _, ep := range []fabric.Endpoint{s.ep2, s.ep1} {
		done := make(chan fabric.Message, 1)
		go func() { done <- recvCtx(ctx, ep) }()
		time.Sleep(bellDelay)
		start := time.Now()
		a := ep.Addr()
		c.ok("send 10 %d %d 6 %x 5000", a.Node, a.VPID, "hello from c")
		m := <-done // recvCtx returns by ctx's deadline at the latest
		if d := time.Since(start); d > promptWake {
			t.Errorf("go woke %v after the send: not by the ring", d)
		}
		if m.Peer != cAddr || m.Tag != 6 || string(m.Payload()) != "hello from c" {
			t.Errorf("go got %v tag %d %q", m.Peer, m.Tag, m.Payload())
		}
	}
	st := c.stats()
	if st["rings"]+st["futexwakes"] == 0 {
		t.Errorf("c producer never woke a sleeping go consumer: %v", st)
	}

	// Echo: 200 messages of every length, in order.
	c.send("echo 10 200 5000")
	for i := 0; i < 200; i++ {
		p := seeded(i%(fabric.MaxVELOPayload+1), byte(i))
		var m fabric.Message
		m.Peer, m.Tag = cAddr, fabric.Tag(i)
		m.SetPayload(p)
		if _, err := s.ep2.Send(ctx, []fabric.Message{m}); err != nil {
			t.Fatal(err)
		}
		got := recvOne(t, ctx, s.ep2)
		if got.Peer != cAddr || got.Tag != fabric.Tag(i) || !bytes.Equal(got.Payload(), p) {
			t.Fatalf("echo %d: got %v tag %d len %d", i, got.Peer, got.Tag, got.Len)
		}
	}
	if r := c.reply(); r != "ok" {
		t.Fatalf("c echo: %s", r)
	}
	if st := c.stats(); st["corrupt"] != 0 || st["sent"] < 202 || st["recv"] < 202 {
		t.Errorf("c stats after clean traffic: %v", st)
	}
	if gs := s.node2.Stats(); gs.Corrupt != 0 {
		t.Errorf("go corrupt = %d after clean traffic", gs.Corrupt)
	}
	c.ok("exit")
}

// TestCABIRMA: PUT and GET with every notification of Table 3.1 in both
// directions between C (1:10) and Go (2:1, and 1:1 on C's own node),
// checked by content and by the notifications' fields.
func TestCABIRMA(t *testing.T) {
	s := newCABI(t)
	c := s.c
	cAddr := fabric.Addr{Node: 1, VPID: 10}
	const size = 4096
	cn := s.c.region(10, size)
	c.ok("fill %d %d 3", cn, size)
	gr := fabrictest.Register(t, s.ep2, size)
	copy(gr.Buf, seeded(size, 50))
	all := fabric.NotifyRequester | fabric.NotifyCompleter

	// C PUT → Go: requester (C) and completer (Go).
	c.ok("post 10 1 2 1 %d %d 1000 %d", cn, gr.NLA+8, all)
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpPut, Peer: s.ep2.Addr(), Len: 1000, Local: fabric.LastFrame(cn, 1000)})
	pollWant(t, s.ep2, fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: cAddr, Len: 1000, Local: fabric.LastFrame(gr.NLA+8, 1000)})
	if !bytes.Equal(gr.Buf[8:1008], seeded(1000, 3)) {
		t.Error("C PUT: Go region content differs")
	}

	// C GET ← Go: requester and completer (C), responder (Go).
	c.ok("post 10 2 2 1 %d %d 992 %d", cn+2048, gr.NLA+1024, all|fabric.NotifyResponder)
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpGet, Peer: s.ep2.Addr(), Len: 992, Local: fabric.LastFrame(cn+2048, 992)})
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpGet, Peer: s.ep2.Addr(), Len: 992, Local: fabric.LastFrame(cn+2048, 992)})
	pollWant(t, s.ep2, fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: cAddr, Len: 992, Local: fabric.LastFrame(gr.NLA+1024, 992)})
	if got := c.dump(cn+2048, 992); !bytes.Equal(got, gr.Buf[1024:2016]) {
		t.Error("C GET: C region content differs")
	}

	// Go PUT → C, Go GET ← C with the responder notification.
	copy(gr.Buf, seeded(size, 90))
	if _, err := s.ep2.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: cAddr, Local: gr.NLA, Remote: cn + 100, Len: 300, Notify: all}}); err != nil {
		t.Fatal(err)
	}
	pollWant(t, s.ep2, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpPut, Peer: cAddr, Len: 300, Local: gr.NLA})
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: s.ep2.Addr(), Len: 300, Local: cn + 100})
	if got := c.dump(cn+100, 300); !bytes.Equal(got, gr.Buf[:300]) {
		t.Error("Go PUT: C region content differs")
	}
	if _, err := s.ep2.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: cAddr, Local: gr.NLA + 3000, Remote: cn, Len: 1000, Notify: fabric.NotifyRequester | fabric.NotifyResponder}}); err != nil {
		t.Fatal(err)
	}
	pollWant(t, s.ep2, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpGet, Peer: cAddr, Len: 1000, Local: fabric.LastFrame(gr.NLA+3000, 1000)})
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: s.ep2.Addr(), Len: 1000, Local: fabric.LastFrame(cn, 1000)})
	if got := c.dump(cn, 1000); !bytes.Equal(got, gr.Buf[3000:4000]) {
		t.Error("Go GET: Go region content differs")
	}

	// Same node: C PUT into the owner's VPID 1 region.
	or := fabrictest.Register(t, s.ep1, size)
	c.ok("post 10 1 1 1 %d %d 496 %d", cn, or.NLA, all)
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpPut, Peer: s.ep1.Addr(), Len: 496, Local: cn})
	pollWant(t, s.ep1, fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: cAddr, Len: 496, Local: or.NLA})
	if got := c.dump(cn, 496); !bytes.Equal(got, or.Buf[:496]) {
		t.Error("C PUT same node: content differs")
	}
	if st := c.stats(); st["corrupt"] != 0 || st["faults"] != 0 || st["posted"] != 3 {
		t.Errorf("c stats: %v", st)
	}
	c.ok("exit")
}

// forgeMailbox writes a bad entry into VPID to's mailbox or notification
// queue through n's view of it, as a buggy producer could: "len" a
// published slot of length 127, "mcbit" one with descriptor bit 39 set,
// "bad" a claimed position whose status word has no legal state, "note"
// a published notification with reserved bits set.
func forgeMailbox(t testing.TB, n *nicT, to fabric.Addr, kind string) {
	t.Helper()
	p, err := n.getPeer(to.Node)
	if err != nil {
		t.Fatal(err)
	}
	vf, err := n.vpid(p, to.VPID)
	if err != nil {
		t.Fatal(err)
	}
	defer vf.m.release()
	desc := fabric.Descriptor{Node: n.node, VPID: 1, Tag: 7}.Encode()
	if kind == "note" {
		pos := vf.ntail.Add(1) - 1
		vf.nclaimer(pos).Store(uint64(n.node) + 1)
		binary.LittleEndian.PutUint64(vf.nbody(pos), 1|1<<2|0xAB<<56)
		vf.nstatus(pos).Store(pos + 1)
		return
	}
	pos := vf.tail.Add(1) - 1
	st := vf.slot(pos)
	switch kind {
	case "len":
		st.Store(seq24(pos+1)<<seqShift | desc | 127<<32)
	case "mcbit":
		st.Store(seq24(pos+1)<<seqShift | desc | 1<<39)
	case "bad":
		st.Store(seq24(pos)<<seqShift | 0x1234<<20)
	default:
		t.Fatalf("forge %q", kind)
	}
}

// TestCABIBadInput: forged mailbox slots and notifications in both
// directions, out-of-bounds and foreign-region RMA both ways, and forged
// region-table entries (a size larger than the region file, reserved
// bits) read by C: every one counted, nothing delivered from it, and
// both sides keep working.
func TestCABIBadInput(t *testing.T) {
	s := newCABI(t)
	c := s.c
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cAddr := fabric.Addr{Node: 1, VPID: 10}
	n2 := s.node2.(*nicT)

	// Go → C: three bad slots, then a good message; a bad notification,
	// then a good one.
	for _, k := range []string{"len", "mcbit", "bad"} {
		forgeMailbox(t, n2, cAddr, k)
	}
	sendOne(t, ctx, s.ep2, cAddr, 8, "after the forgeries")
	if from, tag, p := c.recv(10, 5000); from != s.ep2.Addr() || tag != 8 || string(p) != "after the forgeries" {
		t.Errorf("c got %v tag %d %q after forged slots", from, tag, p)
	}
	if st := c.stats(); st["corrupt"] != 3 {
		t.Errorf("c corrupt = %d after 3 forged slots, want 3", st["corrupt"])
	}
	forgeMailbox(t, n2, cAddr, "note")
	gr := fabrictest.Register(t, s.ep2, 4096)
	cn := c.region(10, 4096)
	if _, err := s.ep2.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: cAddr, Local: gr.NLA, Remote: cn, Len: 64, Notify: fabric.NotifyCompleter}}); err != nil {
		t.Fatal(err)
	}
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: s.ep2.Addr(), Len: 64, Local: cn})
	if st := c.stats(); st["corrupt"] != 4 {
		t.Errorf("c corrupt = %d after a forged notification, want 4", st["corrupt"])
	}

	// C → Go: the same forgeries written by C.
	before := s.node2.Stats().Corrupt
	for _, k := range []string{"len", "mcbit", "bad", "note"} {
		c.ok("forge 2 1 %s", k)
	}
	c.ok("send 10 2 1 9 %x 5000", "c after forgeries")
	if m := recvOne(t, ctx, s.ep2); m.Peer != cAddr || m.Tag != 9 || string(m.Payload()) != "c after forgeries" {
		t.Errorf("go got %v tag %d %q after forged slots", m.Peer, m.Tag, m.Payload())
	}
	c.ok("post 10 1 2 1 %d %d 16 %d", cn, gr.NLA, fabric.NotifyCompleter)
	pollWant(t, s.ep2, fabric.Notification{Kind: fabric.KindCompleter, Op: fabric.OpPut, Peer: cAddr, Len: 16, Local: gr.NLA})
	if d := s.node2.Stats().Corrupt - before; d != 4 {
		t.Errorf("go corrupt grew by %d after 4 forgeries by C, want 4", d)
	}

	// C's RMA faults: local ones refused synchronously, remote ones an
	// error notification with Local as posted.
	for _, bad := range []string{
		fmt.Sprintf("post 10 1 2 1 %d %d 0 1", cn, gr.NLA),           // length 0
		fmt.Sprintf("post 10 1 2 1 %d %d %d 1", cn, gr.NLA, 8<<20+1), // length > 8 MiB
		fmt.Sprintf("post 10 1 2 1 %d %d 100 4", cn, gr.NLA),         // PUT with responder
		fmt.Sprintf("post 10 3 2 1 %d %d 100 1", cn, gr.NLA),         // bad op
		fmt.Sprintf("post 10 1 2 1 %d %d 100 1", cn+4000, gr.NLA),    // local out of bounds
		fmt.Sprintf("post 10 1 2 1 %d %d 100 1", gr.NLA, gr.NLA),     // local not ours
	} {
		if r := c.do("%s", bad); r != "err -22" {
			t.Errorf("%s: %s, want err -22", bad, r)
		}
	}
	or := fabrictest.Register(t, s.ep1, 4096)
	remote := []struct {
		peer fabric.Addr
		nla  fabric.NLA
		want fabric.NotifyErr
	}{
		{s.ep2.Addr(), gr.NLA + 4000, fabric.NErrBounds},
		{s.ep2.Addr(), fabric.MakeNLA(3000, 0), fabric.NErrAccess},   // unregistered
		{s.ep2.Addr(), 0, fabric.NErrAccess},                         // NLA 0
		{fabric.Addr{Node: 2, VPID: 2}, gr.NLA, fabric.NErrAccess},   // another VPID's region
		{fabric.Addr{Node: 1, VPID: 2}, or.NLA, fabric.NErrAccess},   // the owner's, wrong VPID
		{fabric.Addr{Node: 9, VPID: 1}, gr.NLA, fabric.NErrPeerDown}, // no such node
	}
	for _, r := range remote {
		c.ok("post 10 2 %d %d %d %d 200 0", r.peer.Node, r.peer.VPID, cn, r.nla)
		noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpGet, Err: r.want, Peer: r.peer, Len: 200, Local: cn})
	}

	// Forged region table entries on node 2, read by C: a size larger
	// than the region file (a SIGBUS if C trusted it), and reserved bits.
	idx := uint32(4000)
	w0, w1 := n2.entryWords(n2.nodeMap.b, idx)
	path := n2.regionPath(2, n2.inc, idx, 1)
	if err := os.WriteFile(path, make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	defer w0.Store(0)
	w1.Store(1 << 20)
	w0.Store(encodeRegionEntry(regionEntry{Gen: 1, Valid: true, Owner: 1}))
	corrupt := c.stats()["corrupt"]
	c.ok("post 10 2 2 1 %d %d 200 1", cn, fabric.MakeNLA(idx, 8192))
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpGet, Err: fabric.NErrAccess, Peer: s.ep2.Addr(), Len: 200, Local: cn})
	w0.Store(encodeRegionEntry(regionEntry{Gen: 1, Valid: true, Owner: 1}) | 1<<20)
	c.ok("post 10 2 2 1 %d %d 50 1", cn, fabric.MakeNLA(idx, 0))
	noteWant(t, c, 10, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpGet, Err: fabric.NErrAccess, Peer: s.ep2.Addr(), Len: 50, Local: cn})
	if d := c.stats()["corrupt"] - corrupt; d != 2 {
		t.Errorf("c corrupt grew by %d for 2 forged region entries, want 2", d)
	}

	// Go's RMA faults against C's regions.
	c.ok("open 11 0")
	cn11 := c.region(11, 4096)
	for _, r := range []struct {
		remote fabric.NLA
		want   fabric.NotifyErr
	}{{cn + 4000, fabric.NErrBounds}, {cn11, fabric.NErrAccess}, {fabric.MakeNLA(idx, 0), fabric.NErrAccess}} {
		if _, err := s.ep2.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: cAddr, Local: gr.NLA, Remote: r.remote, Len: 200, Notify: fabric.NotifyRequester}}); err != nil {
			t.Fatal(err)
		}
		pollWant(t, s.ep2, fabric.Notification{Kind: fabric.KindRequester, Op: fabric.OpGet, Err: r.want, Peer: cAddr, Len: 200, Local: gr.NLA})
	}

	// Both still work.
	c.send("echo 10 1 5000")
	sendOne(t, ctx, s.ep2, cAddr, 1, "still alive")
	if m := recvOne(t, ctx, s.ep2); string(m.Payload()) != "still alive" {
		t.Errorf("echo after bad input: %q", m.Payload())
	}
	if r := c.reply(); r != "ok" {
		t.Errorf("c echo: %s", r)
	}
	c.ok("exit")
}

// TestCABISpaceBell: a Go sender blocked on the full 2-slot mailbox of a
// C consumer parks on its space bell (docs/shm-abi.md "Blocked
// senders"), and each message the C consumer takes wakes it through the
// bell: 40 messages go through, in order, without a futex fallback.
// The send has no timer of its own: a ring the C side failed to write
// leaves it parked until the test's deadline, which fails the test.
func TestCABISpaceBell(t *testing.T) {
	const n = 40
	s := newCABI(t)
	s.c.ok("open 11 2") // a 2-slot mailbox
	c, dst := s.c, fabric.Addr{Node: 1, VPID: 11}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		for i := range n {
			var m fabric.Message
			m.Peer, m.Tag = dst, fabric.Tag(i)
			m.SetPayload([]byte{byte(i)})
			if _, err := s.ep2.Send(ctx, []fabric.Message{m}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	waitFor(t, "the go sender parked on the space bell", func() bool { return wakeStats(t, s.node2).SpaceParks > 0 })
	for i := range n {
		c.send("recv 11 5000")
		from, tag, p := c.recv2()
		if from != s.ep2.Addr() || tag != fabric.Tag(i) || len(p) != 1 || p[0] != byte(i) {
			t.Fatalf("message %d: from %v tag %d %x", i, from, tag, p)
		}
		time.Sleep(time.Millisecond) // let the sender park again
	}
	if err := <-errc; err != nil {
		t.Fatalf("blocked send: %v", err)
	}
	ws := wakeStats(t, s.node2)
	t.Logf("go sender's wake stats %+v", ws)
	if ws.SpaceParks < 2 || ws.SpaceFallback != 0 {
		t.Fatalf("space parks %d, fallbacks %d: want parks and no futex fallback", ws.SpaceParks, ws.SpaceFallback)
	}
	c.ok("exit")
}
