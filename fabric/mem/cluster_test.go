package mem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

func newNIC(t testing.TB, c *mem.Cluster, id fabric.NodeID) fabric.NIC {
	t.Helper()
	n, err := c.NewNIC(id)
	if err != nil {
		t.Fatalf("NewNIC(%d): %v", id, err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func TestNodeIDReuse(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	a := newNIC(t, c, 1)
	b := newNIC(t, c, 2)
	if _, err := c.NewNIC(2); !errors.Is(err, fabric.ErrInUse) {
		t.Fatalf("duplicate live node: %v, want ErrInUse", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Alive(2); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("Alive(2) after close = %v", err)
	}
	// A restarted peer reuses the ID and is reachable again.
	b2 := newNIC(t, c, 2)
	if err := a.Alive(2); err != nil {
		t.Fatalf("Alive(2) after restart = %v", err)
	}
	src, dst := fabrictest.OpenEP(t, a, 1), fabrictest.OpenEP(t, b2, 1)
	m := fabric.Message{Peer: dst.Addr(), Len: 3, Data: [120]byte{1, 2, 3}}
	if _, err := src.Send(context.Background(), []fabric.Message{m}); err != nil {
		t.Fatal(err)
	}
	var in [1]fabric.Message
	if k, _ := dst.Recv(in[:]); k != 1 || !bytes.Equal(in[0].Payload(), []byte{1, 2, 3}) {
		t.Fatalf("restarted peer got %d messages: %+v", k, in[0])
	}
}

func TestNotifyDepthOverflow(t *testing.T) {
	const depth = 8
	var logBuf bytes.Buffer
	c := mem.NewCluster(mem.WithNotifyDepth(depth), mem.WithLogger(slog.New(slog.NewTextHandler(&logBuf, nil))))
	n := newNIC(t, c, 1)
	ep := fabrictest.OpenEP(t, n, 1)
	r := fabrictest.Register(t, ep, 64)
	req := fabric.RMA{Op: fabric.OpPut, Peer: ep.Addr(), Local: r.NLA, Remote: r.NLA + 32, Len: 8, Notify: fabric.NotifyRequester | fabric.NotifyCompleter}
	for range depth {
		if _, err := ep.Post([]fabric.RMA{req}); err != nil {
			t.Fatal(err)
		}
	}
	// Two notifications per request: depth fit, depth overflow.
	if got := n.Stats().NotifyOverflow; got != depth {
		t.Fatalf("NotifyOverflow = %d, want %d", got, depth)
	}
	buf := make([]fabric.Notification, 2*depth)
	if k, _ := ep.PollNotifications(buf); k != depth {
		t.Fatalf("polled %d, want %d", k, depth)
	}
	// Every overflow is counted; the log has one line (rate-limited,
	// internal/ratelog) naming the node.
	if log := logBuf.String(); strings.Count(log, "notification queue full") != 1 || !strings.Contains(log, "node=1") {
		t.Fatalf("fault log:\n%s", log)
	}
}

// TestZeroAlloc proves the steady-state data path does not allocate.
func TestZeroAlloc(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation allocates")
	}
	c := mem.NewCluster()
	a, b := fabrictest.OpenEP(t, newNIC(t, c, 1), 1), fabrictest.OpenEP(t, newNIC(t, c, 2), 1)
	ra, _ := a.Register(4096)
	rb, _ := b.Register(4096)
	out := []fabric.Message{{Peer: b.Addr(), Len: 120}}
	mc := []fabric.Message{{Peer: fabric.Addr{Node: fabric.NodeID(fabric.Broadcast), VPID: 1}, MC: true, Len: 120}}
	in := make([]fabric.Message, 4)
	reqs := []fabric.RMA{
		{Op: fabric.OpPut, Peer: b.Addr(), Local: ra.NLA, Remote: rb.NLA, Len: 4096, Notify: fabric.NotifyRequester | fabric.NotifyCompleter},
		{Op: fabric.OpGet, Peer: b.Addr(), Local: ra.NLA, Remote: rb.NLA, Len: 4096, Notify: fabric.NotifyRequester | fabric.NotifyCompleter | fabric.NotifyResponder},
		{Op: fabric.OpGet, Peer: b.Addr(), Local: ra.NLA, Remote: rb.NLA + 4000, Len: 4096}, // error notification
	}
	ns := make([]fabric.Notification, 8)
	ctx := context.Background()
	cases := []struct {
		name string
		fn   func()
	}{
		{"send-recv", func() { a.Send(ctx, out); b.Wait(ctx); b.Recv(in) }},
		{"multicast", func() { a.Send(ctx, mc); b.Recv(in) }},
		{"post-poll", func() { a.Post(reqs); a.PollNotifications(ns); b.PollNotifications(ns) }},
	}
	for _, tc := range cases {
		if got := testing.AllocsPerRun(200, tc.fn); got != 0 {
			t.Errorf("%s: %v allocations per run, want 0", tc.name, got)
		}
	}
}

// TestConcurrentClose races sends, RMA and waits against endpoint and NIC
// close; run it with -race. Nothing may hang, panic or touch freed regions.
func TestConcurrentClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	rounds := 30
	if testenv.Small() {
		rounds = 8
	}
	for range rounds {
		c := mem.NewCluster(mem.WithMailboxSlots(8))
		na, nb := newNIC(t, c, 1), newNIC(t, c, 2)
		a, b := fabrictest.OpenEP(t, na, 1), fabrictest.OpenEP(t, nb, 1)
		ra, _ := a.Register(1 << 16)
		rb, _ := b.Register(1 << 16)
		var wg sync.WaitGroup
		wg.Add(3)
		go func() { // sender into a mailbox nobody drains
			defer wg.Done()
			msgs := make([]fabric.Message, 64)
			for i := range msgs {
				msgs[i].Peer = b.Addr()
			}
			for {
				if _, err := a.Send(context.Background(), msgs); err != nil {
					return
				}
			}
		}()
		go func() { // RMA in both directions
			defer wg.Done()
			for i := 0; ; i++ {
				op := fabric.Op(1 + i%2)
				if _, err := b.Post([]fabric.RMA{{Op: op, Peer: a.Addr(), Local: rb.NLA, Remote: ra.NLA, Len: 1 << 16}}); err != nil {
					return
				}
				var ns [16]fabric.Notification
				b.PollNotifications(ns[:])
			}
		}()
		go func() {
			defer wg.Done()
			for b.Wait(context.Background()) == nil {
				var in [16]fabric.Message
				b.Recv(in[:1]) // drain slowly
			}
		}()
		a.Deregister(ra.NLA)
		na.Close()
		nb.Close()
		wg.Wait()
	}
}
