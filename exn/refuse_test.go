package exn

import (
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// recvAdverts takes n adverts off a raw endpoint, in order.
func recvAdverts(tb testing.TB, at *attacker, n int) []fabric.Message {
	tb.Helper()
	var got []fabric.Message
	buf := make([]fabric.Message, 8)
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		k, err := at.ep.Recv(buf)
		if err != nil {
			tb.Fatal(err)
		}
		for _, m := range buf[:k] {
			if m.Tag == tagAdvert {
				got = append(got, m)
			}
		}
		if k == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if len(got) != n {
		tb.Fatalf("got %d adverts, want %d", len(got), n)
	}
	return got
}

// TestLiveReceiverKeepsSlot: an advert to a receiver that is still up is
// not reclaimed at AdvertTimeout (the receiver may still pull it and must
// not read a reused slot), only after liveAdvertFactor × AdvertTimeout.
func TestLiveReceiverKeepsSlot(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	a, clk := clockedNode(t, c, Config{TxSlots: 2, AdvertTimeout: time.Second})
	slow := newAttacker(t, c, 2) // up, but never pulls
	mustTransmit(t, a.eng, frame(fabric.DefaultMACPrefix.MAC(2), a.eng.MAC(), 1000, 0))
	recvAdverts(t, slow, 1)

	clk.Advance(2 * time.Second) // past AdvertTimeout, peer alive
	time.Sleep(3 * housekeepingInterval)
	if s := a.eng.Stats(); s.TxSlotsInUse != 1 || s.AdvertTimeouts != 0 {
		t.Fatalf("live receiver's slot reclaimed at AdvertTimeout: in use %d, timeouts %d", s.TxSlotsInUse, s.AdvertTimeouts)
	}
	clk.Advance(liveAdvertFactor * time.Second) // past the hard limit
	eventually(t, "slot reclaimed at the hard limit", func() bool { return a.eng.Stats().TxSlotsInUse == 0 })
	if s := a.eng.Stats(); s.AdvertTimeouts != 1 {
		t.Errorf("timeouts %d, want 1", s.AdvertTimeouts)
	}
}

// TestRefusal: a receiver that drops an advert sends it back, and the
// sender frees the slot at once. A refusal from any other node, or for
// another address or length, is counted and frees nothing.
func TestRefusal(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	a, _ := clockedNode(t, c, Config{TxSlots: 2, AdvertTimeout: time.Minute})
	rcv := newAttacker(t, c, 2)
	other := newAttacker(t, c, 3)
	mustTransmit(t, a.eng, frame(fabric.DefaultMACPrefix.MAC(2), a.eng.MAC(), 1000, 0))
	adv := recvAdverts(t, rcv, 1)[0]
	dec, reason := decodeAdvert(adv.Payload(), a.eng.maxFrame)
	if reason != DropNone {
		t.Fatalf("advert: %v", reason)
	}

	forged := []struct {
		name string
		from *attacker
		p    []byte
	}{
		{"wrong node", other, adv.Payload()},
		{"wrong length", rcv, advertBytes(dec.nla, dec.len+1, dec.seq)},
		{"inside the slot", rcv, advertBytes(dec.nla+8, dec.len, dec.seq)},
		{"garbled", rcv, []byte{1, 2, 3}},
	}
	for i, f := range forged {
		f.from.send(t, msg(1, tagRefuse, f.p))
		eventually(t, f.name+" counted", func() bool { return a.eng.Stats().TotalDrops() >= uint64(i+1) })
		if s := a.eng.Stats(); s.TxSlotsInUse != 1 || s.AdvertsRefused != 0 {
			t.Fatalf("%s: forged refusal freed a slot (in use %d, refused %d)", f.name, s.TxSlotsInUse, s.AdvertsRefused)
		}
	}

	rcv.send(t, msg(1, tagRefuse, adv.Payload()))
	eventually(t, "slot freed by refusal", func() bool { return a.eng.Stats().TxSlotsInUse == 0 })
	s := a.eng.Stats()
	if s.AdvertsRefused != 1 || s.OutstandingAdverts != 0 || s.AdvertTimeouts != 0 {
		t.Errorf("refused %d, outstanding %d, timeouts %d", s.AdvertsRefused, s.OutstandingAdverts, s.AdvertTimeouts)
	}
	// A replay of the same refusal frees nothing more.
	rcv.send(t, msg(1, tagRefuse, adv.Payload()))
	eventually(t, "replay counted", func() bool { return a.eng.Stats().TotalDrops() >= uint64(len(forged)+1) })
	if s := a.eng.Stats(); s.AdvertsRefused != 1 {
		t.Errorf("replayed refusal counted as a refusal: %d", s.AdvertsRefused)
	}
}

// TestRefuseQueue: the receive side queues refusals without blocking and
// the refuser sends them back to the advertiser.
func TestRefuseQueue(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	ns := newNodes(t, c, Config{}, 1)
	b := ns[0]
	snd := newAttacker(t, c, 2)
	a := advert{nla: snd.reg.NLA, len: 1000, seq: 7}
	b.eng.refuse(2, a)
	var got []fabric.Message
	buf := make([]fabric.Message, 4)
	eventually(t, "refusal arrives", func() bool {
		k, _ := snd.ep.Recv(buf)
		got = append(got, buf[:k]...)
		return len(got) > 0
	})
	if got[0].Tag != tagRefuse {
		t.Fatalf("tag %#x, want refusal", got[0].Tag)
	}
	if d, r := decodeAdvert(got[0].Payload(), b.eng.maxFrame); r != DropNone || d != a {
		t.Fatalf("refusal carries %+v (%v), want %+v", d, r, a)
	}
	if s := b.eng.Stats(); s.RefusalsSent != 1 {
		t.Errorf("refusals sent %d", s.RefusalsSent)
	}
}
