package integration

import (
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// TestNetLazySessions (issue #36, docs/fabric-net.md "Sessions on first
// use"): four nodes on the net fabric, idle, hold no fabric session;
// IPv6 and ARP broadcasts reach the others by datagram without making
// any. A ping from node 1 to node 3 makes the one session between them
// (the ARP request by datagram, the rest on the session), and nodes 2
// and 4 still hold none. The higher node sending first (node 4 pings
// node 2 with a static neighbour entry) gets its session through a dial
// request.
func TestNetLazySessions(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ping")
	const metrics = "127.0.0.1:9464"
	c := nstest.StartNetClusterEach(t, nstest.Build(t), 57, []int{1, 2, 3, 4}, func(int) []string { return []string{"--metrics", metrics} })
	n := c.Nodes
	sessions := func(i int) float64 { return sample(t, scrape(t, n[i], metrics), "exn_membership_sessions") }
	for i := range n {
		if got := sessions(i); got != 0 {
			t.Errorf("node %d idle: %v sessions, want 0", n[i].ID, got)
		}
	}
	if _, err := nstest.Ping(n[0].NS, n[2].IP.String(), 2, 56, ""); err != nil {
		t.Fatalf("ping node 1 -> 3: %v", err)
	}
	for i, want := range []float64{1, 0, 1, 0} {
		if got := sessions(i); got != want {
			t.Errorf("node %d after 1 -> 3: %v sessions, want %v", n[i].ID, got, want)
		}
	}
	fams := scrape(t, n[2], metrics)
	if v := sample(t, fams, "exn_membership_multicast_datagrams_total", "direction=rx"); v < 1 {
		t.Errorf("node 3: %v multicast datagrams received, want the ARP request", v)
	}
	// A static neighbour entry: node 4's first frame is unicast, so node
	// 4 needs the session before node 2 hears of it (without it, node
	// 2's ARP reply would dial first).
	n[3].NS.MustRun(t, 5*time.Second, "ip", "neigh", "replace", n[1].IP.String(), "lladdr", "2e:87:04:07:00:02", "dev", "exn0", "nud", "permanent")
	if _, err := nstest.Ping(n[3].NS, n[1].IP.String(), 2, 56, ""); err != nil {
		t.Fatalf("ping node 4 -> 2: %v", err)
	}
	for i, want := range []float64{1, 1, 1, 1} {
		if got := sessions(i); got != want {
			t.Errorf("node %d after 4 -> 2: %v sessions, want %v", n[i].ID, got, want)
		}
	}
	if v := sample(t, scrape(t, n[1], metrics), "exn_membership_dial_requests_total", "direction=rx"); v < 1 {
		t.Errorf("node 2: %v dial requests received, want node 4's", v)
	}
	// Idle again, nothing new is made.
	time.Sleep(time.Second)
	for i := range n {
		if got := sessions(i); got != 1 {
			t.Errorf("node %d idle again: %v sessions, want 1", n[i].ID, got)
		}
	}
}
