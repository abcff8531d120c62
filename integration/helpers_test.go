package integration

// Scaffolding shared by the tests: the gate of the measurements, and the
// tests that kill a node while traffic flows towards it.

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// perfSecs gates a measurement: it skips unless EXN_PERF=1 (timing-
// sensitive), requires root and the tools, and returns the duration of one
// run in seconds (EXN_PERF_SECS, default 3).
func perfSecs(t *testing.T) int {
	t.Helper()
	if os.Getenv("EXN_PERF") != "1" {
		t.Skip("set EXN_PERF=1 to measure")
	}
	testenv.RequirePrivileged(t, "ip", "ss", "iperf3", "ping")
	return testenv.EnvInt("EXN_PERF_SECS", 3)
}

// checkTCP runs iperf3 (TCP, 2 s) from a to b and wants at least
// 50 Mbit/s.
func checkTCP(t *testing.T, a, b *nstest.Node) {
	t.Helper()
	r, err := nstest.Iperf3(t, b.NS, a.NS, b.IP.String(), 2)
	if err != nil {
		t.Fatalf("tcp node %d -> %d: %v", a.ID, b.ID, err)
	}
	t.Logf("tcp node %d -> %d: %.2f Gbit/s, %d retransmits", a.ID, b.ID, r.BitsPerSecond/1e9, r.Retransmits)
	if r.BitsPerSecond < 50e6 {
		t.Errorf("tcp node %d -> %d: %.1f Mbit/s, want at least 50", a.ID, b.ID, r.BitsPerSecond/1e6)
	}
}

// checkSockperf runs sockperf ping-pong (2 s) from a to b and wants at
// least 100 round trips.
func checkSockperf(t *testing.T, a, b *nstest.Node) {
	t.Helper()
	r, err := nstest.Sockperf(t, b.NS, a.NS, b.IP.String(), 2)
	if err != nil {
		t.Fatalf("node %d -> %d: %v", a.ID, b.ID, err)
	}
	t.Logf("sockperf node %d -> %d: p50 %.1f us, p99 %.1f us, %d observations", a.ID, b.ID, r.P50, r.P99, r.Observations)
	if r.Observations < 100 {
		t.Errorf("node %d -> %d: only %d round trips in 2 s", a.ID, b.ID, r.Observations)
	}
}

// iperfTowards starts an iperf3 server on to and a client on from sending
// to it, and returns once the client has reported its first interval: a
// transfer in flight. --snd-timeout bounds how long the client keeps
// unacknowledged data towards a node that dies; checkSurvivors bounds it
// anyway.
func iperfTowards(t *testing.T, from, to *nstest.Node) (srv, cli *nstest.Proc) {
	t.Helper()
	srv, port, err := nstest.StartIperf3Server(t, to.NS, nil, to.IP.String())
	if err != nil {
		t.Fatal(err)
	}
	cli = from.NS.Start(t, "iperf3", "-c", to.IP.String(), "-p", port, "-t", "6", "--connect-timeout", "2000", "--snd-timeout", "3000", "--forceflush")
	if err := nstest.Eventually(5*time.Second, func() error {
		if !strings.Contains(cli.Output(), "bits/sec") {
			return fmt.Errorf("no iperf3 interval yet: %s", cli.Output())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return srv, cli
}

// checkSurvivors checks, after dead's exnd was killed (at killed) while
// n1 sent to it with cli/srv (iperfTowards): n1 and n2 still ping and
// iperf each other, a ping to the dead node fails promptly (no longer
// than ping's own deadline), the iperf3 client towards it ends on its
// own, and neither survivor's exnd exited.
func checkSurvivors(t *testing.T, n1, n2, dead *nstest.Node, srv, cli *nstest.Proc, killed time.Time) {
	t.Helper()
	if _, err := nstest.Ping(n1.NS, n2.IP.String(), 3, 1000, "5a"); err != nil {
		t.Errorf("after kill, 1 -> 2: %v", err)
	}
	if _, err := nstest.Ping(n2.NS, n1.IP.String(), 3, 20000, "a5"); err != nil {
		t.Errorf("after kill, 2 -> 1: %v", err)
	}
	if r, err := nstest.Iperf3(t, n2.NS, n1.NS, n2.IP.String(), 2); err != nil {
		t.Errorf("after kill, iperf3 1 -> 2: %v", err)
	} else {
		t.Logf("after kill, iperf3 1 -> 2: %.2f Gbit/s", r.BitsPerSecond/1e9)
	}
	if _, err := n1.NS.Run(5*time.Second, "ping", "-n", "-c", "1", "-W", "1", dead.IP.String()); err == nil ||
		strings.Contains(err.Error(), "timed out") {
		t.Errorf("ping to dead node %d: want a prompt failure, got %v", dead.ID, err)
	}
	if err := cli.Wait(20*time.Second - time.Since(killed)); err != nil && strings.Contains(err.Error(), "still running") {
		t.Errorf("iperf3 towards the dead node hung: %v\n%s", err, cli.Output())
	}
	_ = srv.Wait(0)
	for _, n := range []*nstest.Node{n1, n2} {
		if n.Proc.Exited() {
			t.Errorf("node %d exnd exited after node %d died:\n%s", n.ID, dead.ID, n.Proc.Output())
		}
	}
}
