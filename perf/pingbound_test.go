package perf

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// pingBoundSubnet is BenchmarkPingBound's underlay (10.78.S) and exn0
// (10.77.S) subnet; the relays' TAPs take 10.76.S.
const pingBoundSubnet = 83

// relayPort is the relays' UDP port on the underlay.
const relayPort = 7920

// relayWay is one gateway between the two namespaces that
// BenchmarkPingBound pings through.
type relayWay struct {
	key, desc string
	// target is the address pinged when there is no relay (the
	// underlay's or exn0's).
	target string
	// args is the relay's command line in node id's namespace (nil: no
	// relay, ping target).
	args func(id int) []string
}

// BenchmarkPingBound is issue #35's ping bar priced against what any
// user-space TAP gateway pays on this machine. Two exnd nodes on the net
// fabric in two namespaces on one underlay bridge (as
// BenchmarkShimXHost), and in each repetition (EXN_PERF_REPS, default 3)
// ping's p50 (pingP50: 200 echoes 10 ms apart, each finding the path
// idle) from node 1 to node 2 five ways, interleaved:
//
//   - the underlay's own kernel path (the bar's baseline);
//   - exn0, through both exnd;
//   - tap_relay block (perf/testdata/tap_relay.c): a TAP in each
//     namespace and a C relay that carries each frame in one UDP
//     datagram over the underlay, two threads in blocking reads: the
//     fewest wake-ups (one per hop) any parked gateway can pay;
//   - gorelay (perf/testdata/gorelay): the same relay in Go, parked in
//     the netpoller (exn's tap package and a UDP socket): the Go
//     runtime's price for the same wake-ups;
//   - tap_relay spin: the C relay never parking (each holds a CPU for as
//     long as it runs, so it runs only during its own pings).
//
// After each way's pings, sockperf's TCP ping-pong (64 B, EXN_PERF_SECS,
// default 4) over the same way gives the warm path's p50, for issue #35's
// sockperf bar. Each relay pair is started for its own runs and stopped
// after them.
// The table gives the medians and each way's ratio to the underlay; it
// asserts nothing. perf/ping-bound.sh runs it:
//
//	go test -run '^$' -bench '^BenchmarkPingBound$' -benchtime 1x -timeout 20m ./perf/
func BenchmarkPingBound(b *testing.B) {
	testenv.RequirePrivileged(b, "ip", "ping", "gcc", "sockperf")
	exnd := nstest.Build(b)
	crelay := b.TempDir() + "/tap_relay"
	testenv.MustCC(b, "-O2", "-Wall", "-Werror", "-pthread", "-o", crelay, testenv.ModulePath("perf", "testdata", "tap_relay.c"))
	gorelay := b.TempDir() + "/gorelay"
	if out, err := exec.Command("go", "build", "-o", gorelay, testenv.ModulePath("perf", "testdata", "gorelay")).CombinedOutput(); err != nil {
		b.Fatalf("go build gorelay: %v: %s", err, out)
	}
	reps := perfReps()
	var sb strings.Builder
	fmt.Fprintf(&sb, "ping p50 (µs), 200 echoes 10 ms apart, and sockperf TCP ping-pong 64 B p50, %d s; medians of %d repetitions (the ways interleaved); %d CPUs; load before %s\n\n",
		secs(), reps, numCPU(), loadAvg())

	c := nstest.StartUnderlayCluster(b, exnd, "net", nstest.NetPort, pingBoundSubnet, []int{1, 2})
	n1, n2 := c.Nodes[0], c.Nodes[1]
	ul := func(id int) string { return nstest.UnderlayIP(pingBoundSubnet, id).String() }
	ctap := func(mode string) func(int) []string {
		return func(id int) []string {
			return []string{crelay, mode, "tb0", ul(id), fmt.Sprint(relayPort), ul(3 - id)}
		}
	}
	gotap := func(flags ...string) func(int) []string {
		return func(id int) []string {
			return append(append([]string{gorelay}, flags...), "tb0",
				fmt.Sprintf("%s:%d", ul(id), relayPort), fmt.Sprintf("%s:%d", ul(3-id), relayPort))
		}
	}
	ways := []relayWay{
		{"underlay", "underlay (kernel path)", ul(2), nil},
		{"exn0", "exn0 (exnd on net)", n2.IP.String(), nil},
		{"cblock", "C relay, blocking reads", "", ctap("block")},
		{"go", "Go relay, netpoller", "", gotap()},
		{"goblock", "Go relay, blocking reads on locked threads", "", gotap("-block")},
		{"cspin", "C relay, spinning", "", ctap("spin")},
	}
	p50 := make([][]float64, len(ways))
	sp50 := make([][]float64, len(ways))
	for range reps {
		for i, w := range ways {
			target := w.target
			var relays []*nstest.Proc
			if w.args != nil {
				target, relays = startRelays(b, w, n1.NS, n2.NS)
			}
			v, err := pingP50(n1.NS, target, pingCount)
			var sp nstest.SockperfResult
			if err == nil {
				sp, err = nstest.SockperfEnv(b, n2.NS, n1.NS, nil, nil, target, secs(), "-m", "64")
			}
			stopRelays(b, relays, n1.NS, n2.NS)
			if err != nil {
				b.Fatalf("%s: %v", w.key, err)
			}
			p50[i] = append(p50[i], v)
			sp50[i] = append(sp50[i], sp.P50)
		}
	}
	fmt.Fprintf(&sb, "| way | ping p50 (µs) | per repetition | / underlay | sockperf 64 B p50 (µs) | per repetition | / underlay |\n|---|---|---|---|---|---|---|\n")
	base, sbase := testenv.Median(p50[0]), testenv.Median(sp50[0])
	for i, w := range ways {
		m, sm := testenv.Median(p50[i]), testenv.Median(sp50[i])
		fmt.Fprintf(&sb, "| %s | %.0f | %s | %.2f× | %.2f | %s | %.2f× |\n", w.desc, m, dsJoin(p50[i]), m/base,
			sm, dsJoin(sp50[i]), sm/sbase)
	}
	fmt.Fprintf(&sb, "\nload at the end %s\n", loadAvg())
	report(b, "", sb.String())
}

// startRelays starts w's relay in both namespaces, gives each TAP
// 10.76.S.id/24 and waits until node 1 reaches node 2 through them; it
// returns node 2's relay address and the relays.
func startRelays(b *testing.B, w relayWay, ns1, ns2 *nstest.Netns) (string, []*nstest.Proc) {
	b.Helper()
	var relays []*nstest.Proc
	for id, ns := range []*nstest.Netns{ns1, ns2} {
		relays = append(relays, ns.Start(b, w.args(id+1)...))
		ready := nstest.Eventually(5*time.Second, func() error {
			_, err := ns.Run(5*time.Second, "ip", "link", "show", "tb0")
			return err
		})
		if ready != nil {
			b.Fatalf("%s: relay TAP in %s: %v", w.key, ns.Name, ready)
		}
		relayAddr(b, ns, "tb0", pingBoundSubnet, id+1, 0)
	}
	target := fmt.Sprintf("10.76.%d.2", pingBoundSubnet)
	if _, err := nstest.Ping(ns1, target, 2, 56, ""); err != nil {
		b.Fatalf("%s: %v", w.key, err)
	}
	return target, relays
}

// stopRelays kills the relays, if any, and waits until the kernel has
// removed their TAPs from the namespaces.
func stopRelays(b *testing.B, relays []*nstest.Proc, ns ...*nstest.Netns) {
	b.Helper()
	if len(relays) == 0 {
		return
	}
	for _, p := range relays {
		if err := p.Kill(); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range ns {
		err := nstest.Eventually(5*time.Second, func() error {
			if _, err := n.Run(5*time.Second, "ip", "link", "show", "tb0"); err == nil {
				return fmt.Errorf("tb0 still in %s", n.Name)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
