package exn

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"max mtu", Config{MTU: MaxMTU}, true},
		{"mtu too large", Config{MTU: MaxMTU + 1}, false},
		{"mtu too small", Config{MTU: 60}, false},
		{"threshold over frame", Config{MTU: 1500, EagerThreshold: 1515}, false},
		{"threshold equal frame", Config{MTU: 1500, EagerThreshold: 1514}, true},
		{"threshold under header", Config{EagerThreshold: 13}, false},
		{"negative budget", Config{RxBudget: -1}, false},
		{"huge notify budget", Config{NotifyBudget: maxBudget + 1}, false},
		{"slots over notify depth", Config{TxSlots: 4000, RxSlots: 200}, false},
		{"negative timeout", Config{AdvertTimeout: -time.Second}, false},
		{"multicast prefix", Config{MACPrefix: fabric.MACPrefix{0x2f, 0, 0, 0}}, false},
		{"universal prefix", Config{MACPrefix: fabric.MACPrefix{0x2c, 0, 0, 0}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.withDefaults()
			if (err == nil) != tc.ok {
				t.Errorf("err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestNewRejectsWrongEndpoint(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	nic, _ := c.NewNIC(1)
	defer nic.Close()
	ep, _ := nic.Open(7)
	if _, err := New(nic, ep, newCollectLink(), Config{}); err == nil {
		t.Fatal("New accepted VPID 7")
	}
}

// TestTxDrops: bad frames are dropped and counted; Transmit consumes them
// and carries on with the good ones.
func TestTxDrops(t *testing.T) {
	a, b := pair(t, Config{MTU: 1500})
	mac := b.eng.MAC()
	foreign := []byte{0x02, 0, 0, 0, 0, 2}
	other := fabric.DefaultMACPrefix.MAC(99) // never on the fabric
	for _, tc := range []struct {
		name string
		f    []byte
		want DropReason
	}{
		{"runt", make([]byte, 13), DropRunt},
		{"empty", nil, DropRunt},
		{"oversize", frame(mac, a.eng.MAC(), 1515, 0), DropOversize},
		{"foreign mac", frame(foreign, a.eng.MAC(), 60, 0), DropForeignMAC},
		{"self", frame(a.eng.MAC(), a.eng.MAC(), 60, 0), DropSelf},
		{"unknown node eager", frame(other, a.eng.MAC(), 60, 0), DropUnknownNode},
		{"unknown node rendezvous", frame(other, a.eng.MAC(), 1000, 0), DropUnknownNode},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.eng.Stats().Drops[tc.want]
			good := frame(mac, a.eng.MAC(), 100, 1)
			n0 := b.link.count()
			mustTransmit(t, a.eng, tc.f, good)
			if got := a.eng.Stats().Drops[tc.want]; got != before+1 {
				t.Errorf("%v drops %d, want %d", tc.want, got, before+1)
			}
			if got := b.link.wait(t, n0+1, 5*time.Second)[n0]; !bytes.Equal(got, good) {
				t.Error("good frame after bad one lost")
			}
		})
	}
	quiet(t, a.eng)
}

// TestPeerDownTx: frames to a node that went away are dropped as
// peer-down, without blocking, and slots come back.
func TestPeerDownTx(t *testing.T) {
	a, b := pair(t, Config{})
	mac := b.eng.MAC()
	b.eng.Close()
	b.nic.Close()
	mustTransmit(t, a.eng, frame(mac, a.eng.MAC(), 60, 0), frame(mac, a.eng.MAC(), 5000, 1), frame(mac, a.eng.MAC(), 300, 2))
	if s := a.eng.Stats(); s.Drops[DropPeerDown] != 3 || s.TxSlotsInUse != 0 {
		t.Errorf("peer-down drops %d, tx slots in use %d", s.Drops[DropPeerDown], s.TxSlotsInUse)
	}
}

func TestBroadcast(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ns := newNodes(t, mem.NewCluster(), Config{}, 1, 2, 3)
	a := ns[0]
	bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	v6 := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	v4 := net.HardwareAddr{0x01, 0x00, 0x5e, 0, 0, 1}
	frames := [][]byte{
		frame(bcast, a.eng.MAC(), 42, 0),
		frame(v6, a.eng.MAC(), 1514, 1),
		frame(v4, a.eng.MAC(), 9000, 2), // over the threshold: still eager
		frame(bcast, a.eng.MAC(), 65535, 3),
	}
	mustTransmit(t, a.eng, frames...)
	for _, n := range ns[1:] {
		got := n.link.wait(t, len(frames), 5*time.Second)
		for i := range frames {
			if !bytes.Equal(got[i], frames[i]) {
				t.Errorf("node %d frame %d differs", n.nic.Node(), i)
			}
		}
		if s := n.eng.Stats(); s.RxFrames[ProtoMulticast] != uint64(len(frames)) {
			t.Errorf("rx multicast %d", s.RxFrames[ProtoMulticast])
		}
	}
	time.Sleep(20 * time.Millisecond)
	if a.link.count() != 0 {
		t.Error("sender received its own broadcast")
	}
	if s := a.eng.Stats(); s.TxFrames[ProtoMulticast] != uint64(len(frames)) || s.TxSlotsInUse != 0 {
		t.Errorf("tx multicast %d, slots %d", s.TxFrames[ProtoMulticast], s.TxSlotsInUse)
	}
}

// attacker is a raw VPID-0 endpoint on a third node: it speaks the wire
// format by hand.
type attacker struct {
	nic fabric.NIC
	ep  fabric.Endpoint
	reg fabric.Region
}

func newAttacker(tb testing.TB, c cluster, id fabric.NodeID) *attacker {
	tb.Helper()
	nic, ep := openEth(tb, c, id)
	reg := fabrictest.Register(tb, ep, 1<<16)
	tb.Cleanup(func() { nic.Close() })
	return &attacker{nic: nic, ep: ep, reg: reg}
}

func msg(to fabric.NodeID, tag fabric.Tag, p []byte) fabric.Message {
	m := fabric.Message{Peer: fabric.Addr{Node: to, VPID: fabric.EthVPID}, Tag: tag}
	m.Len = uint8(copy(m.Data[:], p))
	return m
}

// grantBytes is a grant of incarnation inc naming nlas.
func grantBytes(inc uint32, nlas ...fabric.NLA) []byte {
	b := binary.LittleEndian.AppendUint32(nil, inc)
	for _, a := range nlas {
		b = binary.LittleEndian.AppendUint64(b, uint64(a))
	}
	return b
}

// pushedBytes is a plain push announcement.
func pushedBytes(nla fabric.NLA, n uint32, seq uint16, stamp uint32) []byte {
	b := make([]byte, advertLen+stampLen)
	a := advert{nla: nla, len: n, seq: seq, stamp: stamp}
	a.encodePushed(b, false)
	return b
}

func advertBytes(nla fabric.NLA, n uint32, seq uint16) []byte {
	b := make([]byte, advertLen)
	a := advert{nla: nla, len: n, seq: seq}
	a.encode(b)
	return b
}

func (at *attacker) send(tb testing.TB, msgs ...fabric.Message) {
	tb.Helper()
	if _, err := at.ep.Send(context.Background(), msgs); err != nil {
		tb.Fatal(err)
	}
}

// TestBadInput injects malformed traffic from a raw endpoint and checks
// each is counted under its reason, the engine keeps working and no
// buffer leaks: on mem, where a rendezvous frame comes by GET, and on
// shm, where it is read in place (view.go), with the same drop reasons.
func TestBadInput(t *testing.T) {
	for _, f := range fabrics {
		t.Run(f.name, func(t *testing.T) { badInput(t, f.open(t), f.viewed) })
	}
}

func badInput(t *testing.T, c cluster, viewed bool) {
	testenv.VerifyNoLeaks(t)
	ns := newNodes(t, c, Config{MTU: 9000}, 1, 2)
	a, b := ns[0], ns[1]
	at := newAttacker(t, c, 3)
	to := b.nic.Node()
	full := bytes.Repeat([]byte{0xAA}, fragLen)
	good := frame(b.eng.MAC(), nodeMAC(at.nic.Node()), 100, 9)
	first := tagEager | tagFirst
	last := tagEager | tagLast

	// A second VPID on the attacker owns a region: an advert pointing
	// there must not be able to read it.
	ep1 := fabrictest.OpenEP(t, at.nic, 1)
	reg1 := fabrictest.Register(t, ep1, 4096)
	copy(at.reg.Buf, good)

	for _, tc := range []struct {
		name string
		msgs []fabric.Message
		want DropReason
	}{
		{"reserved tag", []fabric.Message{msg(to, 0x08, good)}, DropBadTag},
		{"grant to an engine that does not push", []fabric.Message{msg(to, tagGrant, grantBytes(7, at.reg.NLA+pushHdrLen))}, DropGrantMalformed},
		{"push into an engine that grants nothing", []fabric.Message{msg(to, tagPushed, pushedBytes(at.reg.NLA+pushHdrLen, 100, 0, 1))}, DropPushForged},
		{"push announcement short", []fabric.Message{msg(to, tagPushed, pushedBytes(at.reg.NLA+pushHdrLen, 100, 0, 1)[:18])}, DropPushForged},
		{"offload push without offload", []fabric.Message{msg(to, tagPushedX, make([]byte, advertXLen+stampLen))}, DropPushForged},
		{"orphan", []fabric.Message{msg(to, tagEager|1, full)}, DropOrphanFragment},
		{"duplicate fragment", []fabric.Message{msg(to, first, full), msg(to, tagEager|0, full)}, DropFragmentSeq},
		{"gap", []fabric.Message{msg(to, first, full), msg(to, tagEager|2, full)}, DropFragmentSeq},
		{"first with index", []fabric.Message{msg(to, first|3, full)}, DropFragmentSeq},
		{"short middle", []fabric.Message{msg(to, first, full[:50])}, DropFragmentLen},
		{"empty last", []fabric.Message{msg(to, first, full), msg(to, last|1, nil)}, DropFragmentLen},
		{"truncated", []fabric.Message{msg(to, first, full), msg(to, first|tagLast, good)}, DropTruncated},
		{"runt", []fabric.Message{msg(to, first|tagLast, good[:10])}, DropRxRunt},
		{"wrong dest", []fabric.Message{msg(to, first|tagLast, frame(a.eng.MAC(), a.eng.MAC(), 60, 0))}, DropWrongDest},
		{"unicast frame to group mac", []fabric.Message{msg(to, first|tagLast, frame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, a.eng.MAC(), 60, 0))}, DropWrongDest},
		{"advert short", []fabric.Message{msg(to, tagAdvert, advertBytes(at.reg.NLA, 100, 0)[:15])}, DropAdvertMalformed},
		{"advert reserved", []fabric.Message{msg(to, tagAdvert, append(advertBytes(at.reg.NLA, 100, 0)[:14], 1, 0))}, DropAdvertMalformed},
		{"advert nla 0", []fabric.Message{msg(to, tagAdvert, advertBytes(0, 100, 0))}, DropAdvertMalformed},
		{"advert len 5", []fabric.Message{msg(to, tagAdvert, advertBytes(at.reg.NLA, 5, 0))}, DropAdvertLength},
		{"advert len over mtu", []fabric.Message{msg(to, tagAdvert, advertBytes(at.reg.NLA, 9015, 0))}, DropAdvertLength},
		{"advert unknown region", []fabric.Message{msg(to, tagAdvert, advertBytes(fabric.MakeNLA(999, 0), 100, 0))}, DropGetAccess},
		{"advert out of bounds", []fabric.Message{msg(to, tagAdvert, advertBytes(at.reg.NLA+(1<<16)-50, 100, 0))}, DropGetBounds},
		{"advert other vpid", []fabric.Message{msg(to, tagAdvert, advertBytes(reg1.NLA, 100, 0))}, DropGetAccess},
		{"advert wrong dest", []fabric.Message{msg(to, tagAdvert, advertBytes(at.reg.NLA+4096, 100, 0))}, DropWrongDest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := b.eng.Stats().Drops[tc.want]
			n0 := b.link.count()
			// A valid single-fragment frame after the garbage resyncs.
			at.send(t, append(tc.msgs, msg(to, first|tagLast, good))...)
			got := b.link.wait(t, n0+1, 5*time.Second)
			if !bytes.Equal(got[n0], good) {
				t.Errorf("frame after bad input differs")
			}
			if s := b.eng.Stats(); s.Drops[tc.want] != before+1 {
				t.Errorf("%v: %d drops, want %d;%s", tc.want, s.Drops[tc.want], before+1, dropsString(s))
			}
		})
	}

	t.Run("multicast advert", func(t *testing.T) {
		before := b.eng.Stats().Drops[DropAdvertMalformed]
		m := msg(fabric.NodeID(fabric.Broadcast), tagAdvert, advertBytes(at.reg.NLA, 100, 0))
		m.MC = true
		at.send(t, m)
		eventually(t, "advert-malformed", func() bool { return b.eng.Stats().Drops[DropAdvertMalformed] == before+1 })
	})
	t.Run("foreign vpid", func(t *testing.T) {
		before := b.eng.Stats().Drops[DropBadSource]
		if _, err := ep1.Send(context.Background(), []fabric.Message{msg(to, first|tagLast, good)}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "bad-source", func() bool { return b.eng.Stats().Drops[DropBadSource] == before+1 })
	})
	t.Run("valid raw advert", func(t *testing.T) {
		// The wire format as documented: a hand-made advert is pulled
		// and the sender gets its responder notification.
		n0 := b.link.count()
		at.send(t, msg(to, tagAdvert, advertBytes(at.reg.NLA, uint32(len(good)), 0)))
		if got := b.link.wait(t, n0+1, 5*time.Second)[n0]; !bytes.Equal(got, good) {
			t.Error("rendezvous frame differs")
		}
		var ns [4]fabric.Notification
		eventually(t, "responder notification", func() bool {
			n, _ := at.ep.PollNotifications(ns[:])
			for _, x := range ns[:n] {
				if x.Kind == fabric.KindResponder && x.Local == fabric.LastFrame(at.reg.NLA, uint32(len(good))) {
					return true
				}
			}
			return false
		})
	})

	// The engine still carries real traffic, and nothing leaked.
	big := frame(b.eng.MAC(), a.eng.MAC(), 5000, 1)
	n0 := b.link.count()
	mustTransmit(t, a.eng, big)
	if got := b.link.wait(t, n0+1, 5*time.Second)[n0]; !bytes.Equal(got, big) {
		t.Error("good traffic after attack differs")
	}
	quiet(t, b.eng)
	// The valid raw advert and the big frame: in place on shm, by GET on
	// mem; the bad adverts read nothing either way.
	if got, want := b.eng.Stats().RxViewed, map[bool]uint64{true: 2, false: 0}[viewed]; got != want {
		t.Errorf("%d frames taken in place, want %d", got, want)
	}
	b.eng.Close()
	if n := b.eng.rx.pool.inUse; n != 0 {
		t.Errorf("%d reassembly buffers leaked", n)
	}
	if n := len(b.eng.rx.free); n != b.eng.cfg.RxSlots {
		t.Errorf("rx buffers free %d of %d", n, b.eng.cfg.RxSlots)
	}
}

func nodeMAC(n fabric.NodeID) net.HardwareAddr { return fabric.DefaultMACPrefix.MAC(n) }

// TestAdvertTimeout: the receiver takes adverts and dies without pulling
// them. Transmit back-pressures while the pool is empty, never hangs, and
// the slots return after AdvertTimeout on the injected clock.
func TestAdvertTimeout(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	const slots = 4
	a, clk := clockedNode(t, c, Config{TxSlots: slots, AdvertTimeout: time.Minute})
	dead := newAttacker(t, c, 2) // takes adverts, never pulls
	dst := fabric.DefaultMACPrefix.MAC(2)
	for i := range slots {
		mustTransmit(t, a.eng, frame(dst, a.eng.MAC(), 1000, uint32(i)))
	}
	if s := a.eng.Stats(); s.TxSlotsInUse != slots || s.OutstandingAdverts != slots {
		t.Fatalf("in use %d, outstanding %d", s.TxSlotsInUse, s.OutstandingAdverts)
	}
	// Pool empty: the next rendezvous frame waits until ctx expires.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	n, err := a.eng.Transmit(ctx, [][]byte{frame(dst, a.eng.MAC(), 1000, 9)})
	cancel()
	if n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Transmit on empty pool: n=%d err=%v", n, err)
	}
	// Not yet expired: housekeeping must not reclaim.
	clk.Advance(30 * time.Second)
	time.Sleep(3 * housekeepingInterval)
	if s := a.eng.Stats(); s.TxSlotsInUse != slots {
		t.Fatalf("reclaimed early: %d in use", s.TxSlotsInUse)
	}
	dead.nic.Close()
	clk.Advance(31 * time.Second)
	eventually(t, "slots reclaimed", func() bool { return a.eng.Stats().TxSlotsInUse == 0 })
	s := a.eng.Stats()
	if s.AdvertTimeouts != slots || s.OutstandingAdverts != 0 {
		t.Errorf("timeouts %d, outstanding %d", s.AdvertTimeouts, s.OutstandingAdverts)
	}
	// The dead node's frames are now dropped, not queued.
	mustTransmit(t, a.eng, frame(dst, a.eng.MAC(), 1000, 10))
	if s := a.eng.Stats(); s.Drops[DropPeerDown] != 1 || s.TxSlotsInUse != 0 {
		t.Errorf("peer-down %d, in use %d", s.Drops[DropPeerDown], s.TxSlotsInUse)
	}
}

// TestSenderDiesBeforeGet: the receiver is busy (its Link blocks) while
// the sender advertises and dies; the GET (or the view) then fails, is
// counted, and the rx buffer comes back.
func TestSenderDiesBeforeGet(t *testing.T) {
	for _, f := range fabrics {
		t.Run(f.name, func(t *testing.T) { senderDiesBeforeGet(t, f.open(t)) })
	}
}

func senderDiesBeforeGet(t *testing.T, c cluster) {
	testenv.VerifyNoLeaks(t)
	ns := newNodes(t, c, Config{}, 1)
	b := ns[0]
	hold := b.link.hold()
	at := newAttacker(t, c, 3)
	to := b.nic.Node()
	good := frame(b.eng.MAC(), nodeMAC(at.nic.Node()), 100, 1)
	copy(at.reg.Buf, good)
	// First frame: the Link blocks on it, so the rx loop is stuck.
	at.send(t, msg(to, tagEager|tagFirst|tagLast, good))
	time.Sleep(10 * time.Millisecond)
	at.send(t, msg(to, tagAdvert, advertBytes(at.reg.NLA, uint32(len(good)), 0)),
		msg(to, tagEager|tagFirst|tagLast, good))
	at.nic.Close()
	close(hold)
	eventually(t, "get-peer-down", func() bool { return b.eng.Stats().Drops[DropGetPeerDown] == 1 })
	quiet(t, b.eng)
}

// TestCloseUnblocks: Close makes Transmits blocked on the tx pool and on
// a full mailbox return net.ErrClosed.
func TestCloseUnblocks(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster(mem.WithMailboxSlots(4))
	ns := newNodes(t, c, Config{TxSlots: 1}, 1)
	a := ns[0]
	newAttacker(t, c, 2) // never reads its mailbox
	dst := fabric.DefaultMACPrefix.MAC(2)
	errs := make(chan error, 2)
	go func() { // fills the mailbox, then blocks in Send
		var fs [][]byte
		for i := range 20 {
			fs = append(fs, frame(dst, a.eng.MAC(), 60, uint32(i)))
		}
		_, err := a.eng.Transmit(context.Background(), fs)
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond)
	go func() { // blocks on txMu or the pool
		_, err := a.eng.Transmit(context.Background(), [][]byte{frame(dst, a.eng.MAC(), 1000, 0), frame(dst, a.eng.MAC(), 1000, 1)})
		errs <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.eng.Close()
	for range 2 {
		if err := testenv.Within(t, "Transmit after Close", errs, 5*time.Second); !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked Transmit returned %v, want net.ErrClosed", err)
		}
	}
	if _, err := a.eng.Transmit(context.Background(), [][]byte{frame(dst, a.eng.MAC(), 60, 0)}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Transmit after Close: %v", err)
	}
	if err := a.eng.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// refusePost is an endpoint whose Post refuses one request (by remote
// address) as the fabric would refuse a bad one: it starts the requests
// before it and returns ErrInvalid for it.
type refusePost struct {
	fabric.Endpoint
	poison fabric.NLA
}

func (r *refusePost) Post(reqs []fabric.RMA) (int, error) {
	for j := range reqs {
		if reqs[j].Remote == r.poison {
			k, err := r.Endpoint.Post(reqs[:j])
			if err != nil {
				return k, err
			}
			return j, fmt.Errorf("refusePost: %w", fabric.ErrInvalid)
		}
	}
	return r.Endpoint.Post(reqs)
}

// TestGetPostRefused: a GET the fabric refuses when the round's GETs are
// posted (flushGets) drops that frame only, as get-post, and frees its
// buffer; the GETs after it in the same round are still posted.
func TestGetPostRefused(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	at := newAttacker(t, c, 3)
	nic, ep := openEth(t, c, 2)
	defer nic.Close()
	const size = 1000
	wrapped := &refusePost{Endpoint: ep, poison: at.reg.NLA + 4096}
	l := newCollectLink()
	e, err := New(nic, wrapped, l, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var msgs []fabric.Message
	for i := range 3 {
		copy(at.reg.Buf[i*4096:], frame(e.MAC(), nodeMAC(at.nic.Node()), size, uint32(i)))
		msgs = append(msgs, msg(2, tagAdvert, advertBytes(at.reg.NLA+fabric.NLA(i*4096), size, uint16(i))))
	}
	at.send(t, msgs...)
	got := l.wait(t, 2, 5*time.Second)
	if len(got) != 2 || binary.BigEndian.Uint32(got[0][14:]) != 0 || binary.BigEndian.Uint32(got[1][14:]) != 2 {
		t.Fatalf("delivered %d frames, want frames 0 and 2", len(got))
	}
	eventually(t, "buffers free", func() bool {
		s := e.Stats()
		return s.RxSlotsInUse == 0 && s.PendingGets == 0
	})
	if s := e.Stats(); s.Drops[DropGetPost] != 1 {
		t.Errorf("get-post drops %d, want 1; %s", s.Drops[DropGetPost], dropsString(s))
	}
}
