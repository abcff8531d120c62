package shm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// viewPair opens nodes 1 and 2 of a fresh fabric, VPID 0 on each, and a
// 4 KiB region of node 2's filled with a pattern. It returns node 1's
// endpoint as a RemoteViewer, node 2's endpoint and its region.
func viewPair(t *testing.T) (fabric.RemoteViewer, fabric.Endpoint, fabric.Region, fabric.NIC) {
	t.Helper()
	fab := uniqueFabric(t)
	nic1, nic2 := openNIC(t, fab, 1), openNIC(t, fab, 2)
	ep1, ep2 := fabrictest.OpenEP(t, nic1, 0), fabrictest.OpenEP(t, nic2, 0)
	reg, err := ep2.Register(4096)
	if err != nil {
		t.Fatal(err)
	}
	for i := range reg.Buf {
		reg.Buf[i] = byte(i * 7)
	}
	v, ok := ep1.(fabric.RemoteViewer)
	if !ok {
		t.Fatalf("%T is not a fabric.RemoteViewer", ep1)
	}
	return v, ep2, reg, nic1
}

// TestViewRemote: a view is the peer's memory in place, checked as a GET
// is, and its end notifies the responder exactly when asked.
func TestViewRemote(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	v, ep2, reg, nic1 := viewPair(t)
	peer := fabric.Addr{Node: 2, VPID: 0}
	get := func(remote fabric.NLA, n uint32) fabric.RMA {
		return fabric.RMA{Op: fabric.OpGet, Peer: peer, Remote: remote, Len: n, Notify: fabric.NotifyResponder}
	}
	tests := []struct {
		name    string
		req     fabric.RMA
		wantNE  fabric.NotifyErr
		wantErr error
	}{
		{"in bounds", get(reg.NLA+100, 200), fabric.NErrNone, nil},
		{"whole region", get(reg.NLA, 4096), fabric.NErrNone, nil},
		{"past the end", get(reg.NLA+4000, 200), fabric.NErrBounds, nil},
		{"unregistered region", get(fabric.MakeNLA(reg.NLA.Region()+5, 0), 10), fabric.NErrAccess, nil},
		{"another VPID's", fabric.RMA{Op: fabric.OpGet, Peer: fabric.Addr{Node: 2, VPID: 3}, Remote: reg.NLA, Len: 10}, fabric.NErrAccess, nil},
		{"unknown node", fabric.RMA{Op: fabric.OpGet, Peer: fabric.Addr{Node: 9}, Remote: reg.NLA, Len: 10}, fabric.NErrPeerDown, nil},
		{"a put", fabric.RMA{Op: fabric.OpPut, Peer: peer, Remote: reg.NLA, Len: 10}, fabric.NErrNone, fabric.ErrInvalid},
		{"length 0", get(reg.NLA, 0), fabric.NErrNone, fabric.ErrInvalid},
		{"bad notify flags", fabric.RMA{Op: fabric.OpGet, Peer: peer, Remote: reg.NLA, Len: 10, Notify: 0x80}, fabric.NErrNone, fabric.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var view fabric.RemoteView
			ne, err := v.ViewRemote(&tc.req, &view)
			if ne != tc.wantNE || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("ViewRemote = %v, %v; want %v, %v", ne, err, tc.wantNE, tc.wantErr)
			}
			if ne != fabric.NErrNone || err != nil {
				if view.Buf != nil || view.Token != nil {
					t.Fatalf("failed view left %d bytes, token %v", len(view.Buf), view.Token)
				}
				return
			}
			off := tc.req.Remote.Offset()
			if !bytes.Equal(view.Buf, reg.Buf[off:off+uint64(tc.req.Len)]) {
				t.Fatal("view differs from the peer's region")
			}
			reg.Buf[off]++ // in place: the view sees the owner's write
			if view.Buf[0] != reg.Buf[off] {
				t.Fatal("view is a copy, not the peer's memory")
			}
			v.EndView(&view, true)
			if view.Token != nil || view.Buf != nil {
				t.Fatal("EndView left the view set")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			nt := pollOne(t, ep2, ctx)
			want := fabric.Notification{Kind: fabric.KindResponder, Op: fabric.OpGet, Peer: fabric.Addr{Node: 1, VPID: 0},
				Len: tc.req.Len, Local: fabric.LastFrame(tc.req.Remote, tc.req.Len)}
			if nt != want {
				t.Fatalf("responder notification %+v, want %+v", nt, want)
			}
		})
	}

	t.Run("no notification unless asked", func(t *testing.T) {
		for _, tc := range []struct {
			notify fabric.Notify
			end    bool
		}{{fabric.NotifyResponder, false}, {0, true}} {
			r := get(reg.NLA, 64)
			r.Notify = tc.notify
			var view fabric.RemoteView
			if ne, err := v.ViewRemote(&r, &view); ne != fabric.NErrNone || err != nil {
				t.Fatal(ne, err)
			}
			v.EndView(&view, tc.end)
		}
		var ns [4]fabric.Notification
		if n, err := ep2.PollNotifications(ns[:]); n != 0 || err != nil {
			t.Fatalf("%d notifications (%v), want none: %+v", n, err, ns[:n])
		}
	})

	t.Run("the mapping is held until EndView", func(t *testing.T) {
		r := get(reg.NLA, 64)
		var view fabric.RemoteView
		if ne, err := v.ViewRemote(&r, &view); ne != fabric.NErrNone || err != nil {
			t.Fatal(ne, err)
		}
		m := view.Token.(*mapping)
		if got := m.refs.Load(); got != 2 { // the peer's cache and the view
			t.Fatalf("mapping references %d during the view, want 2", got)
		}
		v.EndView(&view, false)
		if got := m.refs.Load(); got != 1 {
			t.Fatalf("mapping references %d after EndView, want 1", got)
		}
		v.EndView(&view, false) // an ended view is empty: a no-op
		if got := m.refs.Load(); got != 1 {
			t.Fatalf("mapping references %d after a second EndView, want 1", got)
		}
	})

	t.Run("no allocation", func(t *testing.T) {
		r := get(reg.NLA, 1024)
		var view fabric.RemoteView
		allocs := testing.AllocsPerRun(200, func() {
			v.ViewRemote(&r, &view)
			v.EndView(&view, false)
		})
		if allocs != 0 {
			t.Fatalf("%.1f allocations per view", allocs)
		}
	})

	t.Run("closed endpoint", func(t *testing.T) {
		r := get(reg.NLA, 64)
		var view fabric.RemoteView
		if ne, err := v.ViewRemote(&r, &view); ne != fabric.NErrNone || err != nil {
			t.Fatal(ne, err)
		}
		m := view.Token.(*mapping)
		nic1.Close()
		v.EndView(&view, true) // after Close: the reference goes, nothing is notified
		if got := m.refs.Load(); got > 1 {
			t.Fatalf("mapping references %d after EndView on a closed endpoint", got)
		}
		if _, err := v.ViewRemote(&r, &view); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("ViewRemote on a closed endpoint: %v, want net.ErrClosed", err)
		}
		var ns [4]fabric.Notification
		if n, _ := ep2.PollNotifications(ns[:]); n != 0 {
			t.Fatalf("%d notifications after Close: %+v", n, ns[:n])
		}
	})
}
