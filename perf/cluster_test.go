package perf

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// clusterSizes are the cluster sizes BenchmarkCluster compares (issue
// #36: 24 nodes against 4; EXN_CLUSTER_NODES overrides the larger).
var clusterSizes = []int{4, 24}

// clusterIdle is how long each exnd's idle CPU is measured.
const clusterIdle = 10 * time.Second

// clusterPoll is how often the detection measurement asks every
// surviving node for its fabric peers.
const clusterPoll = 50 * time.Millisecond

// BenchmarkCluster is issue #36's measurement on the net fabric: N exnd
// nodes, one network namespace each, all on one underlay bridge
// (nstest.StartNetCluster), for N = 4 and 24 and for each liveness
// (--liveness swim, the default, and heartbeat, the old one). Per run:
// each exnd's CPU over 10 s of idle (after the mesh is up), as a share
// of one core, how often its threads slept in that time (nstest.Usage:
// the wake-ups, a steadier figure than the CPU), and its resident set
// after it; then the time until every other node reports a node down
// (the "liveness" control operation's up list, polled every 50 ms) once
// its exnd is SIGSTOPped (frozen: its sockets stay open, so only the
// liveness protocol can find it) and once another's is SIGKILLed (its
// sessions close: every peer sees EOF). perf/cluster.sh runs it:
//
//	go test -run '^$' -bench '^BenchmarkCluster$' -benchtime 1x -timeout 30m ./perf/
func BenchmarkCluster(b *testing.B) {
	testenv.RequirePrivileged(b, "ip")
	exnd := nstest.Build(b)
	sizes := slices.Clone(clusterSizes)
	sizes[len(sizes)-1] = testenv.EnvInt("EXN_CLUSTER_NODES", sizes[len(sizes)-1])
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d CPUs; load before %s\n\n", numCPU(), loadAvg())
	sb.WriteString("| liveness | nodes | idle CPU per exnd, mean (% of a core) | max | sleeps per exnd, mean (/s) | RSS per exnd, mean (MiB) | frozen (SIGSTOP) node seen down by every peer (s) | killed (SIGKILL) node seen down by every peer (s) |\n|---|---|---|---|---|---|---|---|\n")
	subnet := 90
	for _, live := range []string{"swim", "heartbeat"} {
		for _, n := range sizes {
			subnet++
			b.Run(fmt.Sprintf("%s/nodes=%d", live, n), func(b *testing.B) {
				r := runCluster(b, exnd, live, n, subnet)
				fmt.Fprintf(&sb, "| %s | %d | %.3f | %.3f | %.1f | %.1f | %s | %s |\n", live, n, r.meanCPU, r.maxCPU, r.sleeps, r.rssMiB, secsOrMissed(r.stopped), secsOrMissed(r.killed))
				b.ReportMetric(r.meanCPU, "%cpu/node")
				b.ReportMetric(r.sleeps, "sleeps/s/node")
				b.ReportMetric(r.stopped.Seconds(), "s-frozen")
				b.ReportMetric(r.killed.Seconds(), "s-killed")
			})
		}
	}
	fmt.Fprintf(&sb, "\nload after %s\n", loadAvg())
	report(b, "cluster liveness on net", sb.String())
}

type clusterResult struct {
	meanCPU, maxCPU float64       // % of a core per exnd, idle
	sleeps          float64       // voluntary context switches per exnd and second, idle (mean)
	rssMiB          float64       // resident set per exnd, mean, after the idle
	stopped, killed time.Duration // until every survivor saw it down; < 0: some never did
}

func secsOrMissed(d time.Duration) string {
	if d < 0 {
		return "not within 10 s"
	}
	return fmt.Sprintf("%.2f", d.Seconds())
}

func runCluster(b *testing.B, exnd, live string, n, subnet int) clusterResult {
	ids := make([]int, n)
	pids := make([]int, n)
	for i := range ids {
		ids[i] = i + 1
	}
	c := nstest.StartNetCluster(b, exnd, subnet, ids, "--liveness", live)
	if err := c.WaitPeers(30*time.Second, c.Nodes...); err != nil {
		b.Fatal(err)
	}
	time.Sleep(2 * time.Second) // joins and their gossip settle
	for i, nd := range c.Nodes {
		pids[i] = nd.Proc.Pid()
	}
	uses, err := nstest.Usage(pids, clusterIdle)
	if err != nil {
		b.Fatal(err)
	}
	var r clusterResult
	for i, u := range uses {
		r.meanCPU += u.CPU / float64(n)
		r.maxCPU = max(r.maxCPU, u.CPU)
		r.sleeps += u.Sleeps / float64(n)
		kib, err := nstest.RSSKiB(pids[i])
		if err != nil {
			b.Fatal(err)
		}
		r.rssMiB += float64(kib) / 1024 / float64(n)
	}
	// Frozen: the last node stops answering anything, its sockets open.
	frozen := c.Nodes[n-1]
	if err := frozen.Proc.Signal(syscall.SIGSTOP); err != nil {
		b.Fatal(err)
	}
	r.stopped = seenDown(b, c.Nodes[:n-1], frozen.ID)
	frozen.Proc.Signal(syscall.SIGCONT)
	// Killed: another node dies; its sessions close at once.
	killed := c.Nodes[n-2]
	if err := killed.Proc.Signal(syscall.SIGKILL); err != nil {
		b.Fatal(err)
	}
	r.killed = seenDown(b, c.Nodes[:n-2], killed.ID)
	return r
}

// seenDown is nstest.SeenDown at clusterPoll, -1 after 10 s.
func seenDown(b *testing.B, nodes []*nstest.Node, id int) time.Duration {
	d, err := nstest.SeenDown(nodes, id, clusterPoll, 10*time.Second)
	if err != nil {
		b.Log(err)
		return -1
	}
	return d
}
