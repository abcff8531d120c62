package gateway

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

func fastLiveness(t *testing.T) {
	saved := LivenessInterval
	LivenessInterval = 10 * time.Millisecond
	t.Cleanup(func() { LivenessInterval = saved })
}

// waitFor polls f every 5 ms for up to 5 s.
func waitFor(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func liveStats(t *testing.T, c *control.Client) LivenessStats {
	t.Helper()
	var s LivenessStats
	call(t, c, &s, "liveness")
	return s
}

func learned(n *testNode, ip string) (arp.Entry, bool) {
	e, ok := n.d.arp.Lookup(netip.MustParseAddr(ip))
	return e, ok && e.Source == arp.Learned
}

// announce makes node n announce 10.0.0.<id> as the kernel would (a
// gratuitous ARP through its TAP), and waits until node at has learned it.
func announce(t *testing.T, n, at *testNode) {
	t.Helper()
	ip := [4]byte{10, 0, 0, byte(n.cfg.Node)}
	if err := n.dev.Inject(garp(n.d.MAC(), ip)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, fmt.Sprintf("node %d learns node %d", at.cfg.Node, n.cfg.Node), func() error {
		if e, ok := learned(at, netip.AddrFrom4(ip).String()); !ok || e.Node != n.cfg.Node {
			return fmt.Errorf("no learned entry: %+v", e)
		}
		return nil
	})
}

// TestLiveness: a peer that leaves the fabric is seen down within a few
// polls, counted once, and its learned neighbour entries (only its own)
// are removed; an entry of the dead node learned afterwards is swept
// too; a restarted node is counted as a rejoin and relearned.
func TestLiveness(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	fastLiveness(t)
	c := mem.NewCluster()
	n1 := startNode(t, c, memConfig(t, 1))
	n2 := startNode(t, c, memConfig(t, 2))
	n3 := startNode(t, c, memConfig(t, 3))
	c1 := dial(t, n1.cfg.Control)

	announce(t, n2, n1)
	announce(t, n3, n1)
	// Nodes 2 and 3 joined after node 1's first poll: two ups.
	waitFor(t, "both peers up", func() error {
		if s := liveStats(t, c1); !slices.Equal(s.Up, []fabric.NodeID{2, 3}) || s.PeerDown != 0 || s.PeerUp != 2 {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})

	if err := n2.d.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "node 2 down", func() error {
		if s := liveStats(t, c1); !slices.Equal(s.Up, []fabric.NodeID{3}) || s.PeerDown != 1 || s.Invalidated < 1 {
			return fmt.Errorf("%+v", s)
		}
		return nil
	})
	t.Logf("down after %v", time.Since(start))
	if e, ok := n1.d.arp.Lookup(netip.MustParseAddr("10.0.0.2")); ok {
		t.Fatalf("dead node's entry still there: %+v", e)
	}
	if _, ok := learned(n1, "10.0.0.3"); !ok {
		t.Fatalf("live node 3's entry was removed")
	}
	var nb []Neighbor
	call(t, c1, &nb, "neighbors")
	for _, e := range nb {
		if e.Node == 2 {
			t.Fatalf("neighbors still lists node 2: %+v", nb)
		}
	}

	// A frame naming the dead node that arrives late (here: sent by node
	// 1 itself, which the table observes the same way) is swept again.
	before := liveStats(t, c1).Invalidated
	if err := n1.dev.Inject(garp(fabric.DefaultMACPrefix.MAC(2), [4]byte{10, 0, 0, 2})); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "late entry of the dead node swept", func() error {
		if _, ok := n1.d.arp.Lookup(netip.MustParseAddr("10.0.0.2")); ok {
			return fmt.Errorf("entry back")
		}
		if s := liveStats(t, c1); s.Invalidated != before+1 {
			return fmt.Errorf("invalidated %d, want %d", s.Invalidated, before+1)
		}
		return nil
	})
	if s := liveStats(t, c1); s.PeerDown != 1 {
		t.Fatalf("one death counted more than once: %+v", s)
	}

	// Rejoin with the same ID.
	n2 = startNode(t, c, memConfig(t, 2))
	waitFor(t, "node 2 rejoins", func() error {
		s := liveStats(t, c1)
		if !slices.Equal(s.Up, []fabric.NodeID{2, 3}) || s.PeerUp != 3 || s.PeerDown != 1 {
			return fmt.Errorf("%+v", s)
		}
		if len(s.Peers) != 2 || s.Peers[0] != (PeerLiveness{Node: 2, Up: true, Downs: 1, SinceSeconds: s.Peers[0].SinceSeconds}) ||
			!s.Peers[1].Up || s.Peers[1].Downs != 0 {
			return fmt.Errorf("peers %+v", s.Peers)
		}
		return nil
	})
	announce(t, n2, n1)

	if err := c1.Call(t.Context(), nil, "liveness", "x"); err == nil {
		t.Fatal("liveness with an argument: no error")
	}
}

// TestLivenessCloseStops: Close stops the watcher goroutine (goleak) and
// is idempotent.
func TestLivenessCloseStops(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	n := startNode(t, c, memConfig(t, 1))
	n.d.Close()
	n.d.Close()
}
