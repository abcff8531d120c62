//go:build ofi && cgo

package ofi

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
)

// TestRMAMerge posts one call of six requests: four GETs that share
// their regions (one provider operation), one out of the remote region's
// bounds, and one more GET after it. Every request gets exactly the
// notifications it would get alone and moves exactly its bytes; the
// merged count says how many rode in another's operation. With RMAMerge
// 1 nothing is merged and the outcome is the same.
func TestRMAMerge(t *testing.T) {
	const piece = 16 << 10
	for _, prov := range []string{"shm", "tcp"} {
		for _, tc := range []struct {
			merge      int
			wantMerged uint64
		}{{0, 3}, {1, 0}} {
			t.Run(fmt.Sprintf("%s/merge=%d", prov, tc.merge), func(t *testing.T) {
				n1, n2 := openPair(t, prov, tc.merge)
				a := fabrictest.OpenEP(t, n1, 1)
				b := fabrictest.OpenEP(t, n2, 1)
				la := fabrictest.Register(t, a, 8*piece)
				rb := fabrictest.Register(t, b, 8*piece)
				for i := range rb.Buf {
					rb.Buf[i] = byte(i*7 + i>>8)
				}
				flags := fabric.NotifyCompleter | fabric.NotifyResponder
				get := func(local, remote, n int) fabric.RMA {
					return fabric.RMA{Op: fabric.OpGet, Peer: b.Addr(), Local: la.NLA + fabric.NLA(local), Remote: rb.NLA + fabric.NLA(remote), Len: uint32(n), Notify: flags}
				}
				// Local and remote pieces out of order and of several
				// lengths: each request's bytes land where it says.
				reqs := []fabric.RMA{
					get(0, 3*piece, piece),
					get(2*piece, 0, piece/2),
					get(piece, 5*piece, 100),
					get(5*piece, piece, piece),
					get(3*piece, 8*piece-10, 20), // past the end: NErrBounds
					get(6*piece, 7*piece, piece),
				}
				if k, err := a.Post(reqs); err != nil || k != len(reqs) {
					t.Fatalf("post: %d, %v", k, err)
				}
				got := collect(t, a, 6)
				bad := 0
				for _, nt := range got {
					switch {
					case nt.Err == fabric.NErrBounds:
						bad++
						if nt.Local != reqs[4].Local {
							t.Errorf("error notification for %v, want %v", nt.Local, reqs[4].Local)
						}
					case nt.Err != fabric.NErrNone || nt.Kind != fabric.KindCompleter:
						t.Errorf("unexpected notification %+v", nt)
					}
				}
				if bad != 1 {
					t.Errorf("%d bounds errors, want 1", bad)
				}
				resp := collect(t, b, 5)
				for _, nt := range resp {
					if nt.Kind != fabric.KindResponder || nt.Err != fabric.NErrNone || nt.Peer != a.Addr() {
						t.Errorf("unexpected responder notification %+v", nt)
					}
				}
				for i, r := range reqs {
					if i == 4 {
						continue
					}
					l, rm := int(r.Local-la.NLA), int(r.Remote-rb.NLA)
					if !bytes.Equal(la.Buf[l:l+int(r.Len)], rb.Buf[rm:rm+int(r.Len)]) {
						t.Errorf("request %d: data differs", i)
					}
				}
				// Bytes no request named stay untouched (zero).
				if la.Buf[piece+100] != 0 || la.Buf[2*piece+piece/2] != 0 || la.Buf[3*piece] != 0 {
					t.Error("a merged GET wrote outside its requests")
				}
				if m := n1.rmaMerged.Load(); m != tc.wantMerged {
					t.Errorf("merged %d requests, want %d", m, tc.wantMerged)
				}
			})
		}
	}
}

// TestNotifyPacketBounds: a pNotify packet carries one to rmaMerge
// notifications; an empty one, a torn one and one with too many are
// dropped as corrupt, and a valid one is delivered whole.
func TestNotifyPacketBounds(t *testing.T) {
	n1, n2 := openPair(t, "shm", 0)
	b := fabrictest.OpenEP(t, n2, 1)
	fa := n2.peer(n1.id).fa
	nt := fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Len: 8, Local: fabric.MakeNLA(1, 0)}
	var one [notifyBody]byte
	nt.Encode(one[:])
	for _, tc := range []struct {
		k, extra int
		corrupt  bool
	}{{0, 0, true}, {1, 3, true}, {rmaMerge + 1, 0, true}, {2, 0, false}} {
		pkt := make([]byte, headerSize, headerSize+(tc.k+1)*notifyBody)
		putHeader(pkt, header{typ: pNotify, desc: fabric.Descriptor{Node: n1.id, VPID: 1}, dst: 1}.encode())
		for range tc.k {
			pkt = append(pkt, one[:]...)
		}
		pkt = append(pkt, make([]byte, tc.extra)...)
		before := n2.Stats().Corrupt
		n2.receive(pkt, fa)
		if got := n2.Stats().Corrupt - before; (got == 1) != tc.corrupt {
			t.Errorf("%d notifications + %d bytes: corrupt rose by %d, want corrupt=%v", tc.k, tc.extra, got, tc.corrupt)
		}
	}
	got := make([]fabric.Notification, 8)
	if k, _ := b.PollNotifications(got); k != 2 {
		t.Fatalf("%d notifications delivered, want 2 (the valid packet's)", k)
	}
}
