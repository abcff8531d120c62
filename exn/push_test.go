package exn

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// pushFrames is a mix of eager and rendezvous frames from a to b, each
// numbered, so that order and content can be checked.
func pushFrames(a, b *node, n int) [][]byte {
	sizes := []int{100, 3000, 9014, 1500, 9014, 60, 5000}
	fs := make([][]byte, n)
	for i := range fs {
		fs[i] = frame(b.eng.MAC(), a.eng.MAC(), sizes[i%len(sizes)], uint32(i))
	}
	return fs
}

// TestPush: two engines with Config.Push on a fabric that orders PUTs
// before sends (mem) carry rendezvous frames by push once the receiver
// has granted buffers; the first ones go by GET. Every frame arrives
// once, in order, intact, with eager frames between them. With push on
// one side only, or on neither, nothing is granted and every rendezvous
// frame goes by GET. Afterwards no tx slot or rx buffer is in use.
func TestPush(t *testing.T) {
	for _, tc := range []struct {
		name       string
		send, recv bool
		pushed     bool
	}{
		{"both", true, true, true},
		{"sender only", true, false, false},
		{"receiver only", false, true, false},
		{"neither", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			c := mem.NewCluster()
			a := newNodes(t, c, Config{MTU: 9000, Push: tc.send}, 1)[0]
			b := newNodes(t, c, Config{MTU: 9000, Push: tc.recv}, 2)[0]
			const n = 700
			fs := pushFrames(a, b, n)
			for i := 0; i < n; i += 50 {
				mustTransmit(t, a.eng, fs[i:i+50]...)
				if i == 0 && tc.pushed {
					// The hellos that enable push travel beside the first
					// batch; on a loaded machine they can arrive after the
					// whole stream, so wait for the first grant (CI, stop 39).
					b.link.wait(t, 50, 20*time.Second)
					waitGrants(t, a, b, 1)
				}
			}
			got := b.link.wait(t, n, 20*time.Second)
			for i := range fs {
				if !bytes.Equal(got[i], fs[i]) {
					t.Fatalf("frame %d (%d bytes) differs or is out of order", i, len(fs[i]))
				}
			}
			as, bs := a.eng.Stats(), b.eng.Stats()
			if d := as.TotalDrops() + bs.TotalDrops(); d != 0 {
				t.Fatalf("%d drops:%s /%s", d, dropsString(as), dropsString(bs))
			}
			pushed := bs.RxFrames[ProtoPush]
			if pushed != as.TxFrames[ProtoPush] {
				t.Fatalf("sent %d pushes, %d arrived", as.TxFrames[ProtoPush], pushed)
			}
			if tc.pushed != (pushed > 0) || tc.pushed != (bs.GrantsSent > 0 && as.GrantsRecv > 0) {
				t.Fatalf("pushed %d frames, granted %d, %d received; want pushes: %v", pushed, bs.GrantsSent, as.GrantsRecv, tc.pushed)
			}
			waitIdle(t, a, b)
			if !tc.pushed {
				return
			}
			// Once the sender holds every grant again, a batch with
			// fewer rendezvous frames than grants goes all by push.
			waitGrants(t, a, b, b.eng.pushGrants())
			fs = pushFrames(a, b, 35) // 25 rendezvous frames
			mustTransmit(t, a.eng, fs...)
			got = b.link.wait(t, n+len(fs), 20*time.Second)
			for i := range fs {
				if !bytes.Equal(got[n+i], fs[i]) {
					t.Fatalf("frame %d differs or is out of order", n+i)
				}
			}
			if s := b.eng.Stats(); s.RxFrames[ProtoRendezvous] != bs.RxFrames[ProtoRendezvous] || s.RxFrames[ProtoPush] != pushed+25 {
				t.Fatalf("with grants at hand: %d frames pulled, %d pushed; want 0 and 25",
					s.RxFrames[ProtoRendezvous]-bs.RxFrames[ProtoRendezvous], s.RxFrames[ProtoPush]-pushed)
			}
			waitIdle(t, a, b)
		})
	}
}

// waitGrants waits until a holds at least want of b's grants.
func waitGrants(tb testing.TB, a, b *node, want int) {
	tb.Helper()
	for end := time.Now().Add(5 * time.Second); a.eng.grants.held(b.nic.Node()) < want; {
		if time.Now().After(end) {
			tb.Fatalf("the sender holds %d grants, want %d", a.eng.grants.held(b.nic.Node()), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitIdle waits until no tx slot and no rx buffer is in use on any of
// ns (the last notifications may still be on their way).
func waitIdle(tb testing.TB, ns ...*node) {
	tb.Helper()
	for end := time.Now().Add(5 * time.Second); ; {
		busy := 0
		for _, n := range ns {
			s := n.eng.Stats()
			busy += s.TxSlotsInUse + s.RxSlotsInUse
		}
		if busy == 0 {
			return
		}
		if time.Now().After(end) {
			tb.Fatalf("%d tx slots and rx buffers still in use", busy)
		}
		time.Sleep(time.Millisecond)
	}
}

// pushPeer starts engine id with Push on a fresh cluster, and a raw
// endpoint on node 3 that said hello to it as a pusher.
func pushPeer(tb testing.TB, id fabric.NodeID) (*node, *attacker) {
	tb.Helper()
	testenv.VerifyNoLeaks(tb)
	c := mem.NewCluster()
	n := newNodes(tb, c, Config{MTU: 9000, Push: true}, id)[0]
	at := newAttacker(tb, c, 3)
	at.send(tb, msg(n.nic.Node(), tagHello, []byte{helloVersion, 0, helloPush}))
	return n, at
}

// grantsFrom reads the attacker's mailbox until grants from node name
// want buffers, and returns their incarnation and NLAs.
func (at *attacker) grantsFrom(tb testing.TB, node fabric.NodeID, want int) (uint32, []fabric.NLA) {
	tb.Helper()
	msgs := make([]fabric.Message, 16)
	var inc uint32
	var nlas []fabric.NLA
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && len(nlas) < want; {
		k, err := at.ep.Recv(msgs)
		if err != nil {
			tb.Fatal(err)
		}
		for _, m := range msgs[:k] {
			if m.Tag != tagGrant || m.Peer.Node != node {
				continue
			}
			i, raw, ok := decodeGrant(m.Payload())
			if !ok {
				tb.Fatalf("malformed grant % x", m.Payload())
			}
			inc = i
			for i := 0; i < len(raw); i += 8 {
				nlas = append(nlas, fabric.NLA(binary.LittleEndian.Uint64(raw[i:])))
			}
		}
		if k == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if len(nlas) < want {
		tb.Fatalf("grants named %d buffers, want %d", len(nlas), want)
	}
	return inc, nlas
}

// TestPushBadInput: a raw source that says it pushes gets grants, and
// what it announces is taken only when its PUT really landed in a buffer
// granted to it: an announcement without a PUT, with another stamp,
// another node in the header, or for a buffer it does not hold is
// dropped and counted, the buffer is granted again, and the engine goes
// on delivering. A correct push from it is delivered.
func TestPushBadInput(t *testing.T) {
	b, at := pushPeer(t, 2)
	to := b.nic.Node()
	good := frame(b.eng.MAC(), nodeMAC(at.nic.Node()), 3000, 1)
	copy(at.reg.Buf[4096:], good)

	// One advert from the pusher: b pulls it and grants.
	at.send(t, msg(to, tagAdvert, advertBytes(at.reg.NLA+4096, uint32(len(good)), 0)))
	b.link.wait(t, 1, 5*time.Second)
	_, nlas := at.grantsFrom(t, to, b.eng.pushGrants())
	// A buffer of b's that is not granted to the attacker (the region
	// and slot size are fixed at New).
	var idle fabric.NLA
	for i := range int32(len(b.eng.rx.slots)) {
		if a := b.eng.rx.nla(i); !slices.Contains(nlas, a) {
			idle = a
			break
		}
	}
	seq := uint16(1)
	// push writes header (node, stamp, length hlen) and frame f into
	// grant g from the attacker's region, as a sender does.
	push := func(g fabric.NLA, node fabric.NodeID, stamp, hlen uint32, f []byte) {
		pushHdr(at.reg.Buf[:pushHdrLen], node, stamp, hlen)
		copy(at.reg.Buf[pushHdrLen:], f)
		r := []fabric.RMA{{Op: fabric.OpPut, Peer: fabric.Addr{Node: to, VPID: fabric.EthVPID}, Local: at.reg.NLA, Remote: g - pushHdrLen, Len: uint32(pushHdrLen + len(f))}}
		if _, err := at.ep.Post(r); err != nil {
			t.Fatal(err)
		}
	}
	announce := func(g fabric.NLA, n, stamp uint32) {
		at.send(t, msg(to, tagPushed, pushedBytes(g, n, seq, stamp)))
		seq++
	}
	me := at.nic.Node()
	n := uint32(len(good))
	for i, tc := range []struct {
		name string
		do   func(g fabric.NLA)
		want DropReason
	}{
		{"no put", func(g fabric.NLA) { announce(g, n, 41) }, DropPushStale},
		{"other stamp", func(g fabric.NLA) { push(g, me, 5, n, good); announce(g, n, 6) }, DropPushStale},
		{"other node in the header", func(g fabric.NLA) { push(g, 99, 7, n, good); announce(g, n, 7) }, DropPushStale},
		{"other length", func(g fabric.NLA) { push(g, me, 8, n, good); announce(g, n-1, 8) }, DropPushStale},
		{"not a buffer start", func(g fabric.NLA) { announce(g+8, n, 9) }, DropPushForged},
		{"past the buffers", func(g fabric.NLA) { announce(g+fabric.NLA(b.eng.rx.slotSize*100), n, 10) }, DropPushForged},
		{"a buffer not granted to it", func(fabric.NLA) { push(idle, me, 12, n, good); announce(idle, n, 12) }, DropPushForged},
		{"good", func(g fabric.NLA) { push(g, me, 11, n, good); announce(g, n, 11) }, DropNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := b.eng.Stats().Drops
			n0 := b.link.count()
			tc.do(nlas[i%len(nlas)])
			// A valid eager frame after it shows the engine goes on.
			small := frame(b.eng.MAC(), nodeMAC(me), 100, uint32(100+i))
			at.send(t, msg(to, tagEager|tagFirst|tagLast, small))
			want := 1
			if tc.want == DropNone {
				want = 2
			}
			got := b.link.wait(t, n0+want, 5*time.Second)
			if !bytes.Equal(got[len(got)-1], small) || (tc.want == DropNone && !bytes.Equal(got[n0], good)) {
				t.Fatal("wrong frames delivered")
			}
			s := b.eng.Stats()
			for r := range NumDropReasons {
				wantN := before[r]
				if r == tc.want && r != DropNone {
					wantN++
				}
				if s.Drops[r] != wantN {
					t.Fatalf("%v: %d drops, want %d;%s", r, s.Drops[r], wantN, dropsString(s))
				}
			}
		})
	}
	if s := b.eng.Stats(); s.RxFrames[ProtoPush] != 1 {
		t.Fatalf("%d frames pushed, want 1", s.RxFrames[ProtoPush])
	}
	// The buffer is freed once its frame is delivered, which the link
	// may see first.
	eventually(t, "every rx buffer free again", func() bool { return b.eng.Stats().RxSlotsInUse == 0 })
}

// TestPushFailed: a receiver that grants a buffer its fabric refuses
// (forged, or gone) makes the PUT fail; the sender counts push-failed,
// frees the tx slot, and the grant does not come back.
func TestPushFailed(t *testing.T) {
	a, at := pushPeer(t, 1)
	me := at.nic.Node()
	at.send(t, msg(a.nic.Node(), tagGrant, grantBytes(7, fabric.MakeNLA(999, pushHdrLen))))
	for end := time.Now().Add(5 * time.Second); a.eng.Stats().GrantsRecv == 0; {
		if time.Now().After(end) {
			t.Fatal("the grant was not taken")
		}
		time.Sleep(time.Millisecond)
	}
	mustTransmit(t, a.eng, frame(nodeMAC(me), a.eng.MAC(), 3000, 1))
	for end := time.Now().Add(5 * time.Second); a.eng.Stats().Drops[DropPushFailed] == 0; {
		if time.Now().After(end) {
			t.Fatalf("no push-failed drop;%s", dropsString(a.eng.Stats()))
		}
		time.Sleep(time.Millisecond)
	}
	waitIdle(t, a)
	// The next frame goes by advert: the failed grant is spent.
	mustTransmit(t, a.eng, frame(nodeMAC(me), a.eng.MAC(), 3000, 2))
	if s := a.eng.Stats(); s.TxFrames[ProtoPush] != 1 || s.TxFrames[ProtoRendezvous] != 1 {
		t.Fatalf("pushes %d, adverts %d; want 1 each", s.TxFrames[ProtoPush], s.TxFrames[ProtoRendezvous])
	}
}

// TestGrantBook: grants are taken oldest first, a new incarnation drops
// the old ones, and the book is bounded.
func TestGrantBook(t *testing.T) {
	var b grantBook
	if _, ok := b.take(1); ok {
		t.Fatal("grant from an empty book")
	}
	b.add(1, 7, []fabric.NLA{100, 200})
	b.add(2, 9, []fabric.NLA{300})
	if g, _ := b.take(1); g != 100 {
		t.Fatalf("took %v, want the oldest (100)", g)
	}
	b.add(1, 8, []fabric.NLA{400}) // restarted: 200 is stale
	if g, _ := b.take(1); g != 400 {
		t.Fatalf("took %v after a new incarnation, want 400", g)
	}
	if _, ok := b.take(1); ok {
		t.Fatal("a stale grant survived")
	}
	b.giveBack(1, 500)
	if g, _ := b.take(1); g != 500 {
		t.Fatalf("took %v, want the grant given back", g)
	}
	many := make([]fabric.NLA, maxBookGrants+10)
	if k := b.add(2, 9, many); k != maxBookGrants-1 {
		t.Fatalf("kept %d of %d, want %d", k, len(many), maxBookGrants-1)
	}
}

// TestDecodeGrant: the shapes a grant may and may not have.
func TestDecodeGrant(t *testing.T) {
	ok := fabric.MakeNLA(3, pushHdrLen)
	for _, tc := range []struct {
		name string
		p    []byte
		want bool
	}{
		{"one", grantBytes(1, ok), true},
		{"fourteen", grantBytes(1, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok), true},
		{"none", grantBytes(1), false},
		{"fifteen", grantBytes(1, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok, ok), false},
		{"ragged", append(grantBytes(1, ok), 0), false},
		{"region 0", grantBytes(1, fabric.MakeNLA(0, 4096)), false},
		{"no room for the header", grantBytes(1, fabric.MakeNLA(3, pushHdrLen-1)), false},
		{"short", []byte{1, 2}, false},
	} {
		if _, _, got := decodeGrant(tc.p); got != tc.want {
			t.Errorf("%s: ok %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPushReceiverRestart: the receiver's node restarts (a new NIC and
// engine under the same node ID) while the sender still holds its old
// grants. Nothing the sender pushes into them is delivered as a frame of
// the new engine's unless that engine granted the buffer; frames keep
// arriving intact and in order (by GET until new grants flow), and once
// the new engine has granted, pushes resume into the new incarnation.
func TestPushReceiverRestart(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	a := newNodes(t, c, Config{MTU: 9000, Push: true}, 1)[0]
	b := newNodes(t, c, Config{MTU: 9000, Push: true}, 2)[0]
	sent := 0
	for round := 0; b.eng.Stats().RxFrames[ProtoPush] == 0 || a.eng.grants.held(2) == 0; round++ {
		if round == 200 {
			t.Fatal("no pushes before the restart")
		}
		mustTransmit(t, a.eng, pushFrames(a, b, 35)...)
		sent += 35
		b.link.wait(t, sent, 20*time.Second)
	}
	b.eng.Close()
	b.nic.Close()

	b2 := newNodes(t, c, Config{MTU: 9000, Push: true}, 2)[0]
	var got [][]byte
	n := 0
	for round := 0; round < 200 && (n < 3*35 || b2.eng.Stats().RxFrames[ProtoPush] == 0); round++ {
		fs := pushFrames(a, b2, 35)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := a.eng.Transmit(ctx, fs)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		// b2 answers, as a TCP receiver would: its hello asks a's.
		mustTransmit(t, b2.eng, frame(a.eng.MAC(), b2.eng.MAC(), 60, uint32(round)))
		n += len(fs)
		time.Sleep(time.Millisecond)
	}
	s := b2.eng.Stats()
	if s.RxFrames[ProtoPush] == 0 {
		t.Fatalf("pushes never resumed after the restart;%s", dropsString(s))
	}
	got = b2.link.wait(t, int(s.RxFrames[ProtoEager]+s.RxFrames[ProtoRendezvous]+s.RxFrames[ProtoPush]), 5*time.Second)
	// Every frame b2 delivered is one a sent to it, intact, in order
	// (frames pushed into stale grants were dropped, not delivered).
	last := -1
	for _, f := range got {
		seq := int(binary.BigEndian.Uint32(f[14:18]))
		want := frame(b2.eng.MAC(), a.eng.MAC(), len(f), uint32(seq))
		if !bytes.Equal(f, want) {
			t.Fatalf("frame %d delivered corrupted", seq)
		}
		if seq <= last && seq != 0 {
			t.Fatalf("frame %d after %d", seq, last)
		}
		last = seq
	}
	t.Logf("after the restart: %d frames sent, %d delivered (%d pushed); drops:%s", n, len(got), s.RxFrames[ProtoPush], dropsString(s))
}
