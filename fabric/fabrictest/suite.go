package fabrictest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// Run runs the conformance suite against the backend f builds. Every
// subtest builds its own fabric.
func Run(t *testing.T, f Factory) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name string
		fn   func(*testing.T, Factory)
	}{
		{"VELOOrder", testVELOOrder},
		{"VELOPayloads", testVELOPayloads},
		{"VELOBackPressure", testBackPressure},
		{"VELOCancelledContext", testCancelledContext},
		{"OpenInUse", testOpenInUse},
		{"SendUnknown", testSendUnknown},
		{"NotificationTable", testNotificationTable},
		{"NotificationLocal", testNotificationLocal},
		{"RMALoopback", testRMALoopback},
		{"RMALocalFaults", testRMALocalFaults},
		{"RMARemoteFaults", testRMARemoteFaults},
		{"RMAVsDeregister", testRMAVsDeregister},
		{"BufferRMA", testBufferRMA},
		{"BufferFaults", testBufferFaults},
		{"BufferDeregister", testBufferDeregister},
		{"PutOrder", testPutOrder},
		{"NotifyOverflow", testNotifyOverflow},
		{"Multicast", testMulticast},
		{"PeerDown", testPeerDown},
		{"ClosedNIC", testClosedNIC},
		{"CloseUnblocks", testCloseUnblocks},
		{"WaitWakes", testWaitWakes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, f) })
	}
}

func testVELOOrder(t *testing.T, f Factory) {
	nics := f(t, 3)
	dst := OpenEP(t, nics[0], 5)
	per := 2000
	if testenv.Small() {
		per = 300
	}
	type src struct {
		nic fabric.NIC
		ep  fabric.Endpoint
	}
	var srcs []src
	for _, n := range nics[1:] {
		for _, v := range []fabric.VPID{1, 2} {
			srcs = append(srcs, src{n, OpenEP(t, n, v)})
		}
	}
	// The destination VPID 5 also gets traffic on node 1 itself (loopback).
	srcs = append(srcs, src{nics[0], OpenEP(t, nics[0], 6)})

	wait := Spawn(len(srcs), func(si int) error {
		s := srcs[si]
		const batch = 7 // odd, so batches straddle the mailbox wrap
		for i := 0; i < per; i += batch {
			var b [batch]fabric.Message
			k := min(batch, per-i)
			for j := range k {
				b[j] = msg(dst.Addr(), fabric.Tag(s.ep.Addr().VPID), uint64(i+j), 8+(i+j)%113)
			}
			if n, err := s.ep.Send(context.Background(), b[:k]); err != nil || n != k {
				return fmt.Errorf("%v: send: n=%d err=%w", s.ep.Addr(), n, err)
			}
		}
		return nil
	})
	got := recvN(t, dst, per*len(srcs))
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	next := map[fabric.Addr]uint64{}
	for i := range got {
		m := &got[i]
		if m.Tag != fabric.Tag(m.Peer.VPID) {
			t.Fatalf("message %d from %v has tag %d: source address not filled in by NIC", i, m.Peer, m.Tag)
		}
		s := seqOf(m)
		if s != next[m.Peer] {
			t.Fatalf("from %v: got seq %d, want %d (order per pair broken)", m.Peer, s, next[m.Peer])
		}
		if int(m.Len) != 8+int(s)%113 {
			t.Fatalf("from %v seq %d: len %d, want %d", m.Peer, s, m.Len, 8+int(s)%113)
		}
		for j := 8; j < int(m.Len); j++ {
			if m.Data[j] != byte(s)+byte(j) {
				t.Fatalf("from %v seq %d: payload byte %d corrupt", m.Peer, s, j)
			}
		}
		next[m.Peer]++
	}
	if len(next) != len(srcs) {
		t.Fatalf("got messages from %d sources, want %d", len(next), len(srcs))
	}
	st := nics[0].Stats()
	if st.VELORecv != uint64(per*len(srcs)) {
		t.Errorf("receiver Stats.VELORecv = %d, want %d", st.VELORecv, per*len(srcs))
	}
	if s := nics[1].Stats(); s.VELOSent != uint64(2*per) {
		t.Errorf("sender Stats.VELOSent = %d, want %d", s.VELOSent, 2*per)
	}
}

func testVELOPayloads(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 2)
	for _, size := range []int{0, 1, 8, fabric.MaxVELOPayload} {
		m := fabric.Message{Peer: b.Addr(), Tag: 0xA5}
		p := make([]byte, size)
		fill(p, byte(size))
		if err := m.SetPayload(p); err != nil {
			t.Fatal(err)
		}
		// A forged source must be overwritten by the NIC.
		send(t, a, m)
		got := recvN(t, b, 1)[0]
		if got.Peer != a.Addr() {
			t.Fatalf("size %d: source %v, want %v", size, got.Peer, a.Addr())
		}
		if got.Tag != 0xA5 || got.MC {
			t.Fatalf("size %d: tag %#x mc %v", size, got.Tag, got.MC)
		}
		checkBytes(t, fmt.Sprintf("payload of %d bytes", size), got.Payload(), p)
	}

	var m fabric.Message
	wantErr(t, "SetPayload 121", m.SetPayload(make([]byte, 121)), fabric.ErrInvalid)
	before := nics[0].Stats().Invalid
	ok := msg(b.Addr(), 1, 0, 8)
	bad := fabric.Message{Peer: b.Addr(), Len: fabric.MaxVELOPayload + 1}
	n, err := a.Send(context.Background(), []fabric.Message{ok, bad, ok})
	wantErr(t, "send 121-byte message", err, fabric.ErrInvalid)
	if n != 1 {
		t.Fatalf("send [ok, bad, ok]: n = %d, want 1", n)
	}
	if got := recvN(t, b, 1); seqOf(&got[0]) != 0 {
		t.Fatal("wrong message delivered before the invalid one")
	}
	badMC := fabric.Message{Peer: fabric.Addr{Node: fabric.MaxGroups, VPID: 2}, MC: true}
	_, err = a.Send(context.Background(), []fabric.Message{badMC})
	wantErr(t, "multicast to group 64", err, fabric.ErrInvalid)
	if got := nics[0].Stats().Invalid - before; got != 2 {
		t.Errorf("Stats.Invalid rose by %d, want 2", got)
	}
}

func testBackPressure(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	ch, limit := fillAndBlock(t, nics[0], a, b.Addr(), context.Background())
	stillBlocked(t, "send to a full mailbox", ch)
	got := recvN(t, b, limit) // draining lets the sender proceed
	r := within(t, "blocked send after drain", ch, deadline)
	if r.err != nil || r.n != limit {
		t.Fatalf("send: n=%d err=%v, want %d, nil", r.n, r.err, limit)
	}
	for i := range got {
		if s := seqOf(&got[i]); s != uint64(i) {
			t.Fatalf("message %d has seq %d: lost or reordered under back-pressure", i, s)
		}
	}
}

func testCancelledContext(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := a.Send(ctx, []fabric.Message{msg(b.Addr(), 1, 0, 8)})
	wantErr(t, "send with cancelled ctx", err, context.Canceled)

	// A sender blocked on a full mailbox returns when its ctx expires.
	ctx, cancel = context.WithCancel(context.Background())
	ch, limit := fillAndBlock(t, nics[0], a, b.Addr(), ctx)
	cancel()
	r := within(t, "blocked send after cancel", ch, prompt)
	wantErr(t, "blocked send after cancel", r.err, context.Canceled)
	if r.n <= 0 || r.n >= limit {
		t.Fatalf("blocked send: n=%d, want 0 < n < %d", r.n, limit)
	}
	// Exactly the reported prefix was delivered.
	got := recvN(t, b, r.n)
	if s := seqOf(&got[r.n-1]); s != uint64(r.n-1) {
		t.Fatalf("last delivered seq %d, want %d", s, r.n-1)
	}
	send(t, a, msg(b.Addr(), 1, 999, 8))
	if got := recvN(t, b, 1); seqOf(&got[0]) != 999 {
		t.Fatalf("message after the cancelled prefix has seq %d: a failed message leaked", seqOf(&got[0]))
	}
}

func testOpenInUse(t *testing.T, f Factory) {
	nics := f(t, 1)
	ep := OpenEP(t, nics[0], 7)
	_, err := nics[0].Open(7)
	wantErr(t, "second open", err, fabric.ErrInUse)
	if nics[0].Stats().InUse == 0 {
		t.Error("Stats.InUse not counted")
	}
	if err := ep.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ep.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	OpenEP(t, nics[0], 7)
	OpenEP(t, nics[0], 8) // other VPIDs are independent
}

func testSendUnknown(t *testing.T, f Factory) {
	nics := f(t, 2)
	a := OpenEP(t, nics[0], 1)
	ctx := context.Background()
	_, err := a.Send(ctx, []fabric.Message{msg(fabric.Addr{Node: 2, VPID: 9}, 1, 0, 8)})
	wantErr(t, "send to unopened vpid", err, fabric.ErrUnknownNode)
	_, err = a.Send(ctx, []fabric.Message{msg(fabric.Addr{Node: 999, VPID: 1}, 1, 0, 8)})
	wantErr(t, "send to unknown node", err, fabric.ErrUnknownNode)
	wantErr(t, "Alive(999)", nics[0].Alive(999), fabric.ErrUnknownNode)
	if err := nics[0].Alive(2); err != nil {
		t.Fatalf("Alive(2) = %v", err)
	}
	if p := nics[0].Peers(); len(p) != 1 || p[0] != 2 {
		t.Fatalf("Peers() = %v, want [2]", p)
	}
	if nics[0].Stats().UnknownNode < 2 {
		t.Error("Stats.UnknownNode not counted")
	}
}

// notifyCase is one row of Table 3.1: who gets which notification.
type notifyCase struct {
	op    fabric.Op
	flags fabric.Notify
	req   []fabric.NotifyKind // on the requester, in any order
	peer  []fabric.NotifyKind // on the peer
}

func table31() []notifyCase {
	R, C, S := fabric.NotifyRequester, fabric.NotifyCompleter, fabric.NotifyResponder
	kR, kC, kS := fabric.KindRequester, fabric.KindCompleter, fabric.KindResponder
	return []notifyCase{
		{fabric.OpPut, 0, nil, nil},
		{fabric.OpPut, R, []fabric.NotifyKind{kR}, nil},
		{fabric.OpPut, C, nil, []fabric.NotifyKind{kC}},
		{fabric.OpPut, R | C, []fabric.NotifyKind{kR}, []fabric.NotifyKind{kC}},
		{fabric.OpGet, 0, nil, nil},
		{fabric.OpGet, R, []fabric.NotifyKind{kR}, nil},
		{fabric.OpGet, C, []fabric.NotifyKind{kC}, nil},
		{fabric.OpGet, S, nil, []fabric.NotifyKind{kS}},
		{fabric.OpGet, R | C, []fabric.NotifyKind{kR, kC}, nil},
		{fabric.OpGet, C | S, []fabric.NotifyKind{kC}, []fabric.NotifyKind{kS}},
		{fabric.OpGet, R | S, []fabric.NotifyKind{kR}, []fabric.NotifyKind{kS}},
		{fabric.OpGet, R | C | S, []fabric.NotifyKind{kR, kC}, []fabric.NotifyKind{kS}},
	}
}

func testNotificationTable(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 3), OpenEP(t, nics[1], 4)
	la, rb := Register(t, a, 4096), Register(t, b, 4096)
	const off, n = 100, 1000
	for _, tc := range table31() {
		t.Run(fmt.Sprintf("%v-%03b", tc.op, tc.flags), func(t *testing.T) {
			fill(la.Buf, byte(tc.flags))
			fill(rb.Buf, byte(tc.flags)+100)
			r := fabric.RMA{Op: tc.op, Peer: b.Addr(), Local: la.NLA + off, Remote: rb.NLA + 2*off, Len: n, Notify: tc.flags}
			post(t, a, r)
			// A no-notification request is followed by one that notifies
			// the requester, so its completion is observable and ordered.
			marker := len(tc.req) == 0 && len(tc.peer) == 0
			if marker {
				post(t, a, fabric.RMA{Op: fabric.OpGet, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 1, Notify: fabric.NotifyRequester})
			}
			checkKinds := func(ep fabric.Endpoint, want []fabric.NotifyKind, peer fabric.Addr, localBase fabric.NLA) {
				t.Helper()
				got := pollN(t, ep, len(want))
				seen := map[fabric.NotifyKind]bool{}
				for _, g := range got {
					if g.Err != fabric.NErrNone || g.Op != tc.op || g.Len != n || g.Peer != peer {
						t.Fatalf("%v: bad notification %s", ep.Addr(), describe(g))
					}
					if want := fabric.LastFrame(localBase, n); g.Local != want {
						t.Fatalf("%v: %v notification local %v, want %v", ep.Addr(), g.Kind, g.Local, want)
					}
					seen[g.Kind] = true
				}
				for _, k := range want {
					if !seen[k] {
						t.Fatalf("%v: missing %v notification, got %v", ep.Addr(), k, got)
					}
				}
			}
			checkKinds(a, tc.req, b.Addr(), la.NLA+off)
			checkKinds(b, tc.peer, a.Addr(), rb.NLA+2*off)
			if marker {
				got := pollN(t, a, 1)[0]
				if got.Kind != fabric.KindRequester || got.Len != 1 {
					t.Fatalf("marker: got %s", describe(got))
				}
			}
			noNotifications(t, a)
			noNotifications(t, b)
			src, dst := la.Buf[off:off+n], rb.Buf[2*off:2*off+n]
			if tc.op == fabric.OpGet {
				src, dst = dst, src
			}
			checkBytes(t, "transferred data", dst, src)
		})
	}
	// PUT has no responder (Table 3.1): rejected locally.
	_, err := a.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 1, Notify: fabric.NotifyResponder}})
	wantErr(t, "put with responder flag", err, fabric.ErrInvalid)
}

func testNotificationLocal(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 2)
	sizes := []int{1, fabric.RMAMTU - 1, fabric.RMAMTU, fabric.RMAMTU + 1, 3 * fabric.RMAMTU, 64<<10 + 1}
	if !testenv.Small() {
		sizes = append(sizes, fabric.MaxRMALen)
	}
	const off = 48 // non-zero start, so LastFrame is checked relative to it
	maxSize := sizes[len(sizes)-1] + off
	la, rb := Register(t, a, maxSize), Register(t, b, maxSize)
	for _, size := range sizes {
		for _, op := range []fabric.Op{fabric.OpPut, fabric.OpGet} {
			t.Run(fmt.Sprintf("%v-%d", op, size), func(t *testing.T) {
				fill(la.Buf[off:off+size], byte(size))
				fill(rb.Buf[off:off+size], byte(size)+1)
				flags := fabric.NotifyRequester | fabric.NotifyCompleter
				if op == fabric.OpGet {
					flags |= fabric.NotifyResponder
				}
				localStart, remoteStart := la.NLA+off, rb.NLA+off
				post(t, a, fabric.RMA{Op: op, Peer: b.Addr(), Local: localStart, Remote: remoteStart, Len: uint32(size), Notify: flags})
				wantLocal, wantRemote := fabric.LastFrame(localStart, uint32(size)), fabric.LastFrame(remoteStart, uint32(size))
				if size > 0 && (wantLocal < localStart || wantLocal >= localStart+fabric.NLA(size)) {
					t.Fatalf("LastFrame(%v, %d) = %v outside the transfer", localStart, size, wantLocal)
				}
				reqN := 1
				if op == fabric.OpGet {
					reqN = 2
				}
				for _, n := range pollN(t, a, reqN) {
					if n.Local != wantLocal || n.Len != uint32(size) {
						t.Fatalf("requester side: %s, want local %v", describe(n), wantLocal)
					}
				}
				for _, n := range pollN(t, b, 1) {
					if n.Local != wantRemote || n.Len != uint32(size) {
						t.Fatalf("peer side: %s, want local %v", describe(n), wantRemote)
					}
				}
				src, dst := la.Buf[off:off+size], rb.Buf[off:off+size]
				if op == fabric.OpGet {
					src, dst = dst, src
				}
				checkBytes(t, "data", dst, src)
			})
		}
	}
}

func testRMALoopback(t *testing.T, f Factory) {
	nics := f(t, 1)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[0], 2)
	ra, rb := Register(t, a, 2048), Register(t, b, 2048)
	fill(ra.Buf, 1)
	post(t, a, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: ra.NLA, Remote: rb.NLA + 10, Len: 1000, Notify: fabric.NotifyCompleter})
	n := pollN(t, b, 1)[0]
	if n.Kind != fabric.KindCompleter || n.Peer != a.Addr() || n.Local != fabric.LastFrame(rb.NLA+10, 1000) {
		t.Fatalf("loopback completer: %s", describe(n))
	}
	checkBytes(t, "loopback put", rb.Buf[10:1010], ra.Buf[:1000])
	// Same endpoint, same region: a GET from the region's first half into
	// its second half.
	post(t, a, fabric.RMA{Op: fabric.OpGet, Peer: a.Addr(), Local: ra.NLA + 1024, Remote: ra.NLA, Len: 1024, Notify: fabric.NotifyRequester})
	pollN(t, a, 1)
	checkBytes(t, "self get", ra.Buf[1024:], ra.Buf[:1024])
}

func testRMALocalFaults(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, other, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[0], 2), OpenEP(t, nics[1], 1)
	la, lo, rb := Register(t, a, 1024), Register(t, other, 1024), Register(t, b, 1024)
	ok := fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 16, Notify: fabric.NotifyRequester}
	cases := []struct {
		name string
		mod  func(*fabric.RMA)
	}{
		{"len 0", func(r *fabric.RMA) { r.Len = 0 }},
		{"len over max", func(r *fabric.RMA) { r.Len = fabric.MaxRMALen + 1 }},
		{"bad op", func(r *fabric.RMA) { r.Op = 3 }},
		{"bad flags", func(r *fabric.RMA) { r.Notify = 0x80 }},
		{"local past end", func(r *fabric.RMA) { r.Local = la.NLA + 1020 }},
		{"local unregistered", func(r *fabric.RMA) { r.Local = fabric.MakeNLA(0xFFFFF, 0) }},
		{"local nla 0", func(r *fabric.RMA) { r.Local = 0 }},
		{"local of another vpid", func(r *fabric.RMA) { r.Local = lo.NLA }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := ok
			tc.mod(&bad)
			n, err := a.Post([]fabric.RMA{ok, bad, ok})
			wantErr(t, "post", err, fabric.ErrInvalid)
			if n != 1 {
				t.Fatalf("n = %d, want 1 (reqs[1] failed)", n)
			}
			pollN(t, a, 1) // the first, valid request
			noNotifications(t, a)
		})
	}
}

func testRMARemoteFaults(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b, b2 := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1), OpenEP(t, nics[1], 2)
	la := Register(t, a, 1024)
	rb := Register(t, b, 1024)
	rb2 := Register(t, b2, 1024) // same node, another VPID
	gone := Register(t, b, 1024)
	if err := b.Deregister(gone.NLA); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "deregister twice", b.Deregister(gone.NLA), fabric.ErrInvalid)
	cases := []struct {
		name   string
		remote fabric.NLA
		len    uint32
		err    fabric.NotifyErr
	}{
		{"past end", rb.NLA + 1000, 100, fabric.NErrBounds},
		{"offset beyond region", rb.NLA + 5000, 1, fabric.NErrBounds},
		{"unregistered", fabric.MakeNLA(0xFFFF, 0), 8, fabric.NErrAccess},
		{"nla 0", 0, 8, fabric.NErrAccess},
		{"another vpid's region", rb2.NLA, 8, fabric.NErrAccess},
		{"deregistered", gone.NLA, 8, fabric.NErrAccess},
	}
	for _, tc := range cases {
		for _, op := range []fabric.Op{fabric.OpPut, fabric.OpGet} {
			t.Run(fmt.Sprintf("%v-%s", op, tc.name), func(t *testing.T) {
				fill(la.Buf, 0x11)
				for _, r := range [][]byte{rb.Buf, rb2.Buf} {
					clear(r)
				}
				wantLocal := append([]byte(nil), la.Buf...)
				// Notify 0: the error notification comes regardless.
				local := la.NLA + 4
				post(t, a, fabric.RMA{Op: op, Peer: b.Addr(), Local: local, Remote: tc.remote, Len: tc.len})
				n := pollN(t, a, 1)[0]
				if n.Kind != fabric.KindRequester || n.Err != tc.err || n.Op != op || n.Local != local || n.Peer != b.Addr() {
					t.Fatalf("error notification %s, want requester %v local %v", describe(n), tc.err, local)
				}
				noNotifications(t, b)
				noNotifications(t, b2)
				checkBytes(t, "target memory", rb.Buf, make([]byte, len(rb.Buf)))
				checkBytes(t, "other vpid's memory", rb2.Buf, make([]byte, len(rb2.Buf)))
				checkBytes(t, "local memory", la.Buf, wantLocal)
			})
		}
	}
	st := nics[0].Stats()
	if st.NotifyErrBounds == 0 || st.NotifyErrAccess == 0 {
		t.Errorf("error notifications not counted: %+v", st)
	}
}

func testRMAVsDeregister(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	la := Register(t, a, 64<<10)
	rounds := 50
	if testenv.Small() {
		rounds = 10
	}
	for range rounds {
		rb := Register(t, b, 64<<10)
		done := make(chan struct{})
		var posted int
		go func() {
			defer close(done)
			for i := 0; i < 20; i++ {
				op := fabric.Op(1 + i%2)
				if _, err := a.Post([]fabric.RMA{{Op: op, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 64 << 10, Notify: fabric.NotifyRequester}}); err != nil {
					t.Errorf("post: %v", err)
					return
				}
				posted++
			}
		}()
		if err := b.Deregister(rb.NLA); err != nil {
			t.Fatal(err)
		}
		<-done
		for _, n := range pollN(t, a, posted) {
			if n.Err != fabric.NErrNone && n.Err != fabric.NErrAccess {
				t.Fatalf("racing deregister: %s", describe(n))
			}
		}
	}
}

func testNotifyOverflow(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	la, rb := Register(t, a, 64), Register(t, b, 64)
	const extra = 100
	total := fabric.DefaultNotifyDepth + extra
	reqs := make([]fabric.RMA, 256)
	for i := range reqs {
		reqs[i] = fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 8, Notify: fabric.NotifyRequester}
	}
	for left := total; left > 0; {
		k := min(left, len(reqs))
		post(t, a, reqs[:k]...) // must not block on the full queue
		left -= k
	}
	// Completion may be asynchronous: wait until every request is
	// accounted for, as delivered or as dropped.
	var got int
	buf := make([]fabric.Notification, 512)
	waitFor(t, "all notifications accounted for", func() bool {
		for {
			k, err := a.PollNotifications(buf)
			if err != nil {
				t.Fatal(err)
			}
			if k == 0 {
				break
			}
			got += k
		}
		return uint64(got)+nics[0].Stats().NotifyOverflow >= uint64(total)
	})
	if got < fabric.DefaultNotifyDepth {
		t.Fatalf("queue held %d notifications, contract says at least %d", got, fabric.DefaultNotifyDepth)
	}
	if ov := nics[0].Stats().NotifyOverflow; uint64(got)+ov != uint64(total) {
		t.Fatalf("delivered %d + overflow %d != posted %d", got, ov, total)
	}
	// The queue works again after draining.
	post(t, a, reqs[0])
	pollN(t, a, 1)
}

func testMulticast(t *testing.T, f Factory) {
	nics := f(t, 4)
	const v fabric.VPID = 9
	eps := make([]fabric.Endpoint, len(nics))
	for i, n := range nics {
		eps[i] = OpenEP(t, n, v)
	}
	other := OpenEP(t, nics[0], 10) // another VPID: must not get group traffic
	const g fabric.Group = 5
	for _, i := range []int{0, 1, 2} { // sender's node joins too: excluded anyway
		if err := nics[i].Join(g); err != nil {
			t.Fatal(err)
		}
	}
	wantErr(t, "Join(64)", nics[0].Join(fabric.MaxGroups), fabric.ErrInvalid)
	wantErr(t, "Leave(Broadcast)", nics[0].Leave(fabric.Broadcast), fabric.ErrInvalid)

	// check sends a multicast from node 1, then a unicast marker to every
	// node's VPID v from the same endpoint; each node must see the group
	// message before the marker iff it is in want. An endpoint that says
	// MulticastBestEffort may deliver the group message after the
	// marker, never not at all (the mailboxes here have room).
	bestEffort := false
	if be, ok := eps[0].(fabric.BestEffortMulticaster); ok {
		bestEffort = be.MulticastBestEffort()
	}
	check := func(group fabric.Group, seq uint64, want map[int]bool) {
		t.Helper()
		m := msg(fabric.Addr{Node: fabric.NodeID(group), VPID: v}, 7, seq, 40)
		m.MC = true
		send(t, eps[0], m)
		for i := range nics {
			send(t, eps[0], msg(eps[i].Addr(), 8, seq, 8))
		}
		for i, ep := range eps {
			n := 1
			if want[i] {
				n = 2
			}
			got := recvN(t, ep, n)
			if bestEffort && n == 2 && !got[0].MC {
				got[0], got[1] = got[1], got[0]
			}
			if want[i] {
				if !got[0].MC || got[0].Tag != 7 || got[0].Peer != eps[0].Addr() || seqOf(&got[0]) != seq || got[0].Len != 40 {
					t.Fatalf("group %d: node %d got %+v, want multicast from %v", group, i+1, got[0], eps[0].Addr())
				}
			}
			if mk := got[n-1]; mk.MC || mk.Tag != 8 {
				t.Fatalf("group %d: node %d: got tag %d mc %v where the marker was due (want=%v)", group, i+1, mk.Tag, mk.MC, want[i])
			}
		}
	}
	check(g, 1, map[int]bool{1: true, 2: true})
	check(fabric.Broadcast, 2, map[int]bool{1: true, 2: true, 3: true})
	if k, _ := other.Recv(make([]fabric.Message, 1)); k != 0 {
		t.Fatal("multicast reached a VPID it was not addressed to")
	}
	if err := nics[2].Leave(g); err != nil {
		t.Fatal(err)
	}
	check(g, 3, map[int]bool{1: true})
	if nics[0].Stats().MulticastSent < 3 {
		t.Errorf("Stats.MulticastSent = %d, want >= 3", nics[0].Stats().MulticastSent)
	}
	// A member going down is skipped, not an error.
	if err := nics[3].Close(); err != nil {
		t.Fatal(err)
	}
	m := msg(fabric.Addr{Node: fabric.NodeID(fabric.Broadcast), VPID: v}, 7, 4, 8)
	m.MC = true
	send(t, eps[0], m)
	recvN(t, eps[1], 1)
	recvN(t, eps[2], 1)
}

func testPeerDown(t *testing.T, f Factory) {
	nics := f(t, 3)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	la, rb := Register(t, a, 4096), Register(t, b, 4096)
	ch, _ := fillAndBlock(t, nics[0], a, b.Addr(), context.Background())
	start := time.Now()
	if err := nics[1].Close(); err != nil {
		t.Fatal(err)
	}
	r := within(t, "send blocked on a peer that went down", ch, prompt)
	wantErr(t, "send blocked on a dead peer", r.err, fabric.ErrPeerDown)
	t.Logf("blocked send returned %v after %v", r.err, time.Since(start))

	_, err := a.Send(context.Background(), []fabric.Message{msg(b.Addr(), 1, 0, 8)})
	wantErr(t, "send to a dead peer", err, fabric.ErrPeerDown)
	waitFor(t, "Alive(2) = ErrPeerDown", func() bool { return errors.Is(nics[0].Alive(2), fabric.ErrPeerDown) })
	for _, p := range nics[0].Peers() {
		if p == 2 {
			t.Fatalf("Peers() = %v still lists the dead node", nics[0].Peers())
		}
	}
	if err := nics[0].Alive(3); err != nil {
		t.Fatalf("Alive(3) = %v", err)
	}
	post(t, a, fabric.RMA{Op: fabric.OpGet, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 64, Notify: 0})
	n := pollN(t, a, 1)[0]
	if n.Kind != fabric.KindRequester || n.Err != fabric.NErrPeerDown || n.Local != la.NLA {
		t.Fatalf("rma to a dead peer: %s", describe(n))
	}
	if nics[0].Stats().PeerDown == 0 {
		t.Error("Stats.PeerDown not counted")
	}
	// Closing a peer's VPID (not the node) also releases a blocked sender.
	c := OpenEP(t, nics[2], 1)
	ch, _ = fillAndBlock(t, nics[0], a, c.Addr(), context.Background())
	c.Close()
	r = within(t, "send blocked on a closed vpid", ch, prompt)
	if !errors.Is(r.err, fabric.ErrPeerDown) && !errors.Is(r.err, fabric.ErrUnknownNode) {
		t.Fatalf("send blocked on a closed vpid: %v, want ErrPeerDown or ErrUnknownNode", r.err)
	}
}

func testClosedNIC(t *testing.T, f Factory) {
	nics := f(t, 2)
	a := OpenEP(t, nics[0], 1)
	b := OpenEP(t, nics[1], 1)
	send(t, a, msg(b.Addr(), 1, 1, 8))
	recvN(t, b, 1)
	nics[1].Close()
	waitFor(t, "peer down", func() bool { return errors.Is(nics[0].Alive(2), fabric.ErrPeerDown) })
	_, err := b.Recv(make([]fabric.Message, 1))
	if !errClosed(err) {
		t.Fatalf("Recv on an endpoint of a closed NIC: %v, want net.ErrClosed", err)
	}
	_, err = nics[1].Open(2)
	if !errClosed(err) {
		t.Fatalf("Open on a closed NIC: %v, want net.ErrClosed", err)
	}
}

func testCloseUnblocks(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)

	wait := func(ep fabric.Endpoint) <-chan result {
		ch := make(chan result, 1)
		go func() { ch <- result{0, ep.Wait(context.Background())} }()
		return ch
	}
	// Endpoint.Close unblocks its Wait.
	ch := wait(b)
	stillBlocked(t, "Wait on an idle endpoint", ch)
	b.Close()
	if r := within(t, "Wait after Close", ch, prompt); !errClosed(r.err) {
		t.Fatalf("Wait after Close: %v, want net.ErrClosed", r.err)
	}
	// Endpoint.Close unblocks its own blocked Send.
	b = OpenEP(t, nics[1], 1)
	ch, _ = fillAndBlock(t, nics[0], a, b.Addr(), context.Background())
	a.Close()
	if r := within(t, "Send after own Close", ch, prompt); !errClosed(r.err) {
		t.Fatalf("blocked Send after own Close: %v, want net.ErrClosed", r.err)
	}
	ctx := context.Background()
	if _, err := a.Send(ctx, []fabric.Message{msg(b.Addr(), 1, 0, 8)}); !errClosed(err) {
		t.Fatalf("Send after Close: %v", err)
	}
	if _, err := a.Post([]fabric.RMA{{Op: fabric.OpPut, Peer: b.Addr(), Local: 1 << 40, Remote: 1 << 40, Len: 1}}); !errClosed(err) {
		t.Fatalf("Post after Close: %v", err)
	}
	if _, err := a.PollNotifications(make([]fabric.Notification, 1)); !errClosed(err) {
		t.Fatalf("PollNotifications after Close: %v", err)
	}
	if err := a.Wait(ctx); !errClosed(err) {
		t.Fatalf("Wait after Close: %v", err)
	}
	// NIC.Close unblocks Wait on its endpoints.
	c := OpenEP(t, nics[0], 2)
	ch = wait(c)
	stillBlocked(t, "Wait on an idle endpoint", ch)
	nics[0].Close()
	if r := within(t, "Wait after NIC Close", ch, prompt); !errClosed(r.err) {
		t.Fatalf("Wait after NIC Close: %v, want net.ErrClosed", r.err)
	}
	if err := nics[0].Close(); err != nil {
		t.Fatalf("second NIC Close: %v", err)
	}
}

func testWaitWakes(t *testing.T, f Factory) {
	nics := f(t, 2)
	a, b := OpenEP(t, nics[0], 1), OpenEP(t, nics[1], 1)
	la, rb := Register(t, a, 64), Register(t, b, 64)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	err := b.Wait(ctx)
	cancel()
	wantErr(t, "Wait with nothing to do", err, context.DeadlineExceeded)
	rounds := 20
	if testenv.Small() {
		rounds = 5
	}
	for i := range rounds {
		// Let the waiter get past its spin and park, then wake it with a
		// message (even i) or a notification (odd i).
		ch := make(chan result, 1)
		go func() { ch <- result{0, b.Wait(context.Background())} }()
		time.Sleep(2 * time.Millisecond)
		if i%2 == 0 {
			send(t, a, msg(b.Addr(), 1, uint64(i), 8))
		} else {
			post(t, a, fabric.RMA{Op: fabric.OpPut, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 8, Notify: fabric.NotifyCompleter})
		}
		if r := within(t, "Wait after a message", ch, prompt); r.err != nil {
			t.Fatalf("Wait: %v", r.err)
		}
		if i%2 == 0 {
			recvN(t, b, 1)
		} else {
			pollN(t, b, 1)
		}
	}
}
