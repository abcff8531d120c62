//go:build ofi && cgo

package ofi

import (
	"context"
	"fmt"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
)

// TestBundles: one Send of many messages to one pair travels in few
// provider messages (bundles counted) and arrives whole and in order,
// interleaved with messages to a second VPID of the same node and a
// message too long to share; with NoBundles nothing is bundled and the
// outcome is the same.
func TestBundles(t *testing.T) {
	for _, prov := range []string{"shm", "tcp"} {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/nobundles=%v", prov, off), func(t *testing.T) {
				n1, n2 := openPair(t, prov, 0)
				n1.cfg.NoBundles = off
				a := fabrictest.OpenEP(t, n1, 1)
				b := fabrictest.OpenEP(t, n2, 1)
				c := fabrictest.OpenEP(t, n2, 2)
				msg := func(to fabric.Endpoint, i, n int) fabric.Message {
					m := fabric.Message{Peer: to.Addr(), Tag: fabric.Tag(i), Len: uint8(n)}
					for j := range n {
						m.Data[j] = byte(i + j)
					}
					return m
				}
				// The first message opens the pairs (pOpenQ/pOpenA).
				if _, err := a.Send(context.Background(), []fabric.Message{msg(b, 0, 1), msg(c, 0, 1)}); err != nil {
					t.Fatal(err)
				}
				recvAll(t, b, 1)
				recvAll(t, c, 1)
				var msgs []fabric.Message
				for i := 1; i <= 40; i++ {
					to := b
					if i%10 == 0 {
						to = c
					}
					msgs = append(msgs, msg(to, i, (i*7)%(fabric.MaxVELOPayload+1)))
				}
				before := n1.bundles.Load()
				if k, err := a.Send(context.Background(), msgs); err != nil || k != len(msgs) {
					t.Fatalf("send: %d, %v", k, err)
				}
				got := append(recvAll(t, b, 36), recvAll(t, c, 4)...)
				want := append([]fabric.Message(nil), msgs...)
				var wb, wc []fabric.Message
				for _, m := range want {
					if m.Peer == c.Addr() {
						wc = append(wc, m)
					} else {
						wb = append(wb, m)
					}
				}
				for i, m := range append(wb, wc...) {
					g := got[i]
					if g.Tag != m.Tag || g.Len != m.Len || string(g.Data[:g.Len]) != string(m.Data[:m.Len]) || g.Peer != a.Addr() {
						t.Fatalf("message %d: got tag %d len %d from %v, want tag %d len %d", i, g.Tag, g.Len, g.Peer, m.Tag, m.Len)
					}
				}
				sent := n1.bundles.Load() - before
				if off && sent != 0 || !off && sent == 0 {
					t.Errorf("%d bundles sent with NoBundles=%v", sent, off)
				}
				if s := n1.Stats(); s.VELOSent != 42 {
					t.Errorf("VELOSent %d, want 42", s.VELOSent)
				}
			})
		}
	}
}

// TestBundleForged: a pBundle is delivered only whole and well formed,
// for a source with a credit account; a pVELO whose body disagrees with
// its length is dropped. Each drop is counted as corrupt.
func TestBundleForged(t *testing.T) {
	n1, n2 := openPair(t, "shm", 0)
	a := fabrictest.OpenEP(t, n1, 1)
	b := fabrictest.OpenEP(t, n2, 1)
	if _, err := a.Send(context.Background(), []fabric.Message{{Peer: b.Addr(), Len: 1}}); err != nil {
		t.Fatal(err)
	}
	recvAll(t, b, 1)
	fa := n2.peer(n1.id).fa
	epoch := b.(*endpoint).epoch
	for _, tc := range []struct {
		name    string
		typ     ptype
		vpid    fabric.VPID
		len     uint8
		body    []byte
		deliver int
	}{
		{"two records", pBundle, 1, 0, []byte{7, 1, 0xAA, 8, 0}, 2},
		{"one record", pBundle, 1, 0, []byte{7, 1, 0xAA}, 0},
		{"torn", pBundle, 1, 0, []byte{7, 1, 0xAA, 8, 3, 1}, 0},
		{"no credit account", pBundle, 9, 0, []byte{7, 1, 0xAA, 8, 0}, 0},
		{"velo shorter than its length", pVELO, 1, 8, []byte{1, 2, 3}, 0},
		{"velo longer than its length", pVELO, 1, 2, []byte{1, 2, 3}, 0},
	} {
		pkt := make([]byte, headerSize, headerSize+len(tc.body))
		putHeader(pkt, header{typ: tc.typ, desc: fabric.Descriptor{Node: n1.id, VPID: tc.vpid, Len: tc.len}, dst: 1, epoch: epoch}.encode())
		pkt = append(pkt, tc.body...)
		before := n2.Stats().Corrupt
		n2.receive(pkt, fa)
		corrupt := n2.Stats().Corrupt - before
		k, _ := b.Recv(make([]fabric.Message, 8))
		if k != tc.deliver || (tc.deliver == 0) != (corrupt == 1) {
			t.Errorf("%s: delivered %d (want %d), corrupt +%d", tc.name, k, tc.deliver, corrupt)
		}
	}
}
