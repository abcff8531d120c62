package perf

import (
	"os"
	"strings"
	"testing"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

func TestMain(m *testing.M) { nstest.Main(m) }

// clockTicks is USER_HZ, the unit of /proc/PID/stat times (100 on every
// Linux architecture Go supports).
const clockTicks = 100

// secs is the length of one measurement run in seconds (EXN_PERF_SECS,
// default 4).
func secs() int { return testenv.EnvInt("EXN_PERF_SECS", 4) }

// perfReps is how many times a benchmark repeats its set of runs
// (EXN_PERF_REPS, default 3).
func perfReps() int { return testenv.EnvInt("EXN_PERF_REPS", 3) }

// report ends a benchmark whose runs own the measurement (b.N does not
// scale them): it logs the table s under the line head, writes s to the
// file EXN_PERF_OUT names (perf/bench.sh copies it into docs/), and
// reports 0 ns/op.
func report(b *testing.B, head, s string) {
	b.Helper()
	b.Logf("%s\n%s", head, s)
	if out := os.Getenv("EXN_PERF_OUT"); out != "" {
		if err := os.WriteFile(out, []byte(s), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(0, "ns/op")
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

// loadAvg is the first three fields of /proc/loadavg, the load beside
// every figure.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// pair is the setup most perf benchmarks share: a veth pair between two
// namespaces (the kernel baseline) and two exnd nodes on one shm fabric,
// each in a namespace of its own, with ARP warmed up on both paths.
type pair struct {
	va, vb *nstest.Netns // the veth pair's ends
	vethB  string        // vb's address
	n1, n2 *nstest.Node  // the exnd nodes, 1 and 2
}

// newPair builds a pair: the veth on 10.x.vethSubnet, the nodes on
// 10.77.nodeSubnet. Cleanup is the harness's (namespaces, processes,
// shm files).
func newPair(b *testing.B, vethSubnet, nodeSubnet int) pair {
	b.Helper()
	p := pair{va: nstest.NewNetns(b, "va"), vb: nstest.NewNetns(b, "vb")}
	_, p.vethB = nstest.Veth(b, p.va, p.vb, vethSubnet)
	exnd := nstest.Build(b)
	fab := nstest.ShmFabric(b)
	p.n1 = nstest.StartNode(b, exnd, fab, nodeSubnet, 1)
	p.n2 = nstest.StartNode(b, exnd, fab, nodeSubnet, 2)
	// ARP both ways on both paths (exnd's neighbour table learns node
	// 2's address, which EXT-DS's resolver needs).
	if _, err := nstest.Ping(p.va, p.vethB, 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	if _, err := nstest.Ping(p.n1.NS, p.n2.IP.String(), 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	return p
}
