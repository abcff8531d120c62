package integration

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

var programs = []string{"ip", "ss", "iperf3", "sockperf", "ping"}

// pairs are the unordered node pairs of a 3-node cluster, with the
// direction used for the one-way tools.
var pairs = [][2]int{{0, 1}, {1, 2}, {2, 0}}

func startCluster(t *testing.T, subnet, n int) ([]*nstest.Node, string) {
	t.Helper()
	exnd := nstest.Build(t)
	fab := nstest.ShmFabric(t)
	nodes := make([]*nstest.Node, n)
	for i := range nodes {
		nodes[i] = nstest.StartNode(t, exnd, fab, subnet, i+1)
	}
	return nodes, fab
}

// TestThreeNodes is issue #3 §5: three namespaces, one exnd each, on one
// shm fabric, carrying unmodified ping, iperf3 and sockperf.
func TestThreeNodes(t *testing.T) {
	testenv.RequirePrivileged(t, programs...)
	nodes, fab := startCluster(t, 1, 3)

	t.Run("link", func(t *testing.T) {
		for _, n := range nodes {
			out := n.NS.MustRun(t, 5*time.Second, "ip", "-o", "link", "show", "exn0")
			mac := fmt.Sprintf("link/ether 2e:87:04:07:00:%02x", n.ID)
			if !strings.Contains(out, mac) || !strings.Contains(out, " mtu 65521 ") {
				t.Errorf("node %d: want %q and mtu 65521 in: %s", n.ID, mac, out)
			}
			addrs := n.NS.MustRun(t, 5*time.Second, "ip", "addr", "show", "dev", "exn0")
			for _, want := range []string{n.IP.String() + "/24", n.IP6.String() + "/64"} {
				if !strings.Contains(addrs, want) {
					t.Errorf("node %d: address %s missing: %s", n.ID, want, addrs)
				}
			}
		}
	})

	t.Run("ping4", func(t *testing.T) {
		for _, a := range nodes {
			for _, b := range nodes {
				if a != b {
					if _, err := nstest.Ping(a.NS, b.IP.String(), 3, 56, ""); err != nil {
						t.Errorf("node %d -> %d: %v", a.ID, b.ID, err)
					}
				}
			}
		}
	})

	t.Run("ping6", func(t *testing.T) {
		ll := make([]string, len(nodes))
		for i, n := range nodes {
			a, err := n.WaitIPv6(10 * time.Second)
			if err != nil {
				t.Fatalf("node %d: %v", n.ID, err)
			}
			ll[i] = a.String()
		}
		for i, a := range nodes {
			for j, b := range nodes {
				if i == j {
					continue
				}
				if _, err := nstest.Ping(a.NS, ll[j]+"%exn0", 2, 56, ""); err != nil {
					t.Errorf("link-local node %d -> %d: %v", a.ID, b.ID, err)
				}
				if _, err := nstest.Ping(a.NS, b.IP6.String(), 2, 56, ""); err != nil {
					t.Errorf("global v6 node %d -> %d: %v", a.ID, b.ID, err)
				}
			}
		}
	})

	t.Run("content", func(t *testing.T) {
		// ICMP payload sizes around and far above the 480-byte eager
		// threshold (frame = payload + 8 ICMP + 20 IP + 14 Ethernet):
		// 20 and 400 go eager, 1000, 20000 and 65000 by rendezvous. ping
		// checks every reply byte against the -p pattern.
		for _, size := range []int{20, 400, 1000, 20000, 65000} {
			for _, p := range pairs {
				a, b := nodes[p[0]], nodes[p[1]]
				if _, err := nstest.Ping(a.NS, b.IP.String(), 2, size, "c3a55a0f"); err != nil {
					t.Errorf("ping -s %d node %d -> %d: %v", size, a.ID, b.ID, err)
				}
			}
		}
		transfer(t, nodes[0], nodes[2], 16<<20, 1)
		transfer(t, nodes[1], nodes[0], 3<<20+17, 2)
	})

	t.Run("iperf3", func(t *testing.T) {
		for _, p := range pairs {
			a, b := nodes[p[0]], nodes[p[1]]
			checkTCP(t, a, b)
			u, err := nstest.Iperf3(t, b.NS, a.NS, b.IP.String(), 2, "-u", "-b", "100M")
			if err != nil {
				t.Fatalf("udp node %d -> %d: %v", a.ID, b.ID, err)
			}
			t.Logf("udp node %d -> %d: %.1f Mbit/s, %.2f%% lost", a.ID, b.ID, u.BitsPerSecond/1e6, u.LostPercent)
			if u.LostPercent > 5 || u.BitsPerSecond < 50e6 {
				t.Errorf("udp node %d -> %d at 100M: %.1f Mbit/s, %.2f%% lost", a.ID, b.ID, u.BitsPerSecond/1e6, u.LostPercent)
			}
		}
	})

	t.Run("sockperf", func(t *testing.T) {
		for _, p := range pairs {
			a, b := nodes[p[0]], nodes[p[1]]
			checkSockperf(t, a, b)
		}
	})

	// Last, because it takes node 3 down: SIGKILL its exnd while node 1
	// sends to it; nodes 1 and 2 keep talking, nothing hangs, the dead
	// node's shm files are reclaimed, and a restarted node 3 rejoins.
	t.Run("kill", func(t *testing.T) {
		n1, n2, n3 := nodes[0], nodes[1], nodes[2]
		srv, cli := iperfTowards(t, n1, n3)
		// Then kill node 3's exnd.
		if err := n3.Proc.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := n3.Proc.Wait(5 * time.Second); err == nil {
			t.Fatalf("node 3 exnd exited cleanly after SIGKILL?")
		}
		start := time.Now()
		checkSurvivors(t, n1, n2, n3, srv, cli, start)
		// Survivors reclaim the dead node's shm files.
		if err := nstest.Eventually(10*time.Second, func() error {
			if f := nodeShmFiles(fab, 3); len(f) > 0 {
				return fmt.Errorf("dead node 3's files still there: %v", f)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		// A new exnd with the same node ID rejoins.
		n3.Start(t)
		if _, err := nstest.Ping(n1.NS, n3.IP.String(), 2, 20000, "77"); err != nil {
			t.Errorf("restarted node 3: %v\n%s", err, n3.Proc.Output())
		}
	})
}

// nodeShmFiles lists fabric fab's files that belong to node id.
func nodeShmFiles(fab string, id int) []string {
	var out []string
	re := regexp.MustCompile(fmt.Sprintf(`^/dev/shm/exn-%s-n%d($|\.)`, regexp.QuoteMeta(fab), id))
	for _, f := range nstest.ShmFiles(fab) {
		if re.MatchString(f) {
			out = append(out, f)
		}
	}
	return out
}

// transfer sends size pseudo-random bytes over TCP from node a to node b
// with the test binary as sender and receiver, and compares SHA-256.
func transfer(t *testing.T, a, b *nstest.Node, size int, seed int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("%s:%d", b.IP, nstest.Port())
	recv := b.NS.StartEnv(t, []string{"EXNT_HELPER=recv", "EXNT_ADDR=" + addr}, self)
	out, err := a.NS.RunEnv(30*time.Second, []string{"EXNT_HELPER=send", "EXNT_ADDR=" + addr,
		fmt.Sprintf("EXNT_SIZE=%d", size), fmt.Sprintf("EXNT_SEED=%d", seed)}, self)
	if err != nil {
		t.Fatalf("send %d bytes node %d -> %d: %v\n%s", size, a.ID, b.ID, err, out)
	}
	if err := recv.Wait(10 * time.Second); err != nil {
		t.Fatalf("receive node %d -> %d: %v\n%s", a.ID, b.ID, err, recv.Output())
	}
	sent, got := sumLine(out), sumLine(recv.Output())
	want := fmt.Sprintf("bytes=%d", size)
	if sent == "" || sent != got || !strings.Contains(sent, want) {
		t.Fatalf("node %d -> %d: sent %q, received %q (want %s)", a.ID, b.ID, sent, got, want)
	}
}

func sumLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "sha256=") {
			return l
		}
	}
	return ""
}

// TestSigtermCleanExit: exnd exits 0 on SIGTERM (and on SIGINT), removes
// exn0 and releases its /dev/shm files.
func TestSigtermCleanExit(t *testing.T) {
	testenv.RequirePrivileged(t, programs...)
	nodes, fab := startCluster(t, 2, 2)
	if _, err := nstest.Ping(nodes[0].NS, nodes[1].IP.String(), 1, 56, ""); err != nil {
		t.Fatal(err)
	}
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		n := nodes[i]
		if len(nodeShmFiles(fab, n.ID)) == 0 {
			t.Fatalf("node %d: no shm files while running: %v", n.ID, nstest.ShmFiles(fab))
		}
		if err := n.Proc.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if err := n.Proc.Wait(10 * time.Second); err != nil {
			t.Fatalf("node %d: %v after %v, want exit 0\n%s", n.ID, err, sig, n.Proc.Output())
		}
		if out, err := n.NS.Run(5*time.Second, "ip", "link", "show", "exn0"); err == nil {
			t.Errorf("node %d: exn0 still there after exit: %s", n.ID, out)
		}
		if f := nodeShmFiles(fab, n.ID); len(f) > 0 {
			t.Errorf("node %d: shm files left after exit: %v", n.ID, f)
		}
		for _, want := range []string{"exnd up", "node=" + fmt.Sprint(n.ID), "mac=2e:87:04:07:00:0", "mtu=65521", "fabric=shm:" + fab, "exnd stopped"} {
			if !strings.Contains(n.Proc.Output(), want) {
				t.Errorf("node %d: log lacks %q:\n%s", n.ID, want, n.Proc.Output())
			}
		}
	}
}

// TestBadFlags needs no root: exnd rejects bad command lines with an error
// naming the flag and exit status 2 (1 for a feature not in this build).
func TestBadFlags(t *testing.T) {
	exnd := nstest.Build(t)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--fabric", "shm:x"}, 2, "--node-id is required"},
		{[]string{"--node-id", "70000", "--fabric", "shm:x"}, 2, "--node-id"},
		{[]string{"--node-id", "1"}, 2, "--fabric is required"},
		{[]string{"--node-id", "1", "--fabric", "shm:a/b"}, 2, "--fabric"},
		{[]string{"--node-id", "1", "--fabric", "shm:x", "--addr", "10.0.0.1"}, 2, "-addr"},
		{[]string{"--node-id", "1", "--fabric", "shm:x", "--mtu", "70000"}, 2, "--mtu"},
		{[]string{"--node-id", "1", "--fabric", "mem"}, 1, "cannot span processes"},
		{[]string{"--node-id", "1", "--fabric", "net:127.0.0.1:7000"}, 2, "--peers"},
		{[]string{"--node-id", "1", "--fabric", "ofi:tcp"}, 1, "-tags ofi"},
	}
	for _, tc := range tests {
		out, code := runExnd(t, exnd, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("exnd %q: exit %d, output %q; want exit %d and %q", tc.args, code, out, tc.code, tc.want)
		}
	}
}
