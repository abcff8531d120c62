package nstest

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

func TestMain(m *testing.M) { Main(m) }

// TestHarnessVeth checks the harness itself on a plain veth pair: the
// tool drivers parse real iperf3 and sockperf output, and ping checks
// its pattern. It is the baseline path of the perf benchmark.
func TestHarnessVeth(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "iperf3", "sockperf", "ping")
	a, b := NewNetns(t, "va"), NewNetns(t, "vb")
	ipA, ipB := Veth(t, a, b, 1)
	if _, err := Ping(a, ipB, 2, 1000, "a5"); err != nil {
		t.Fatal(err)
	}
	r, err := Iperf3(t, b, a, ipB, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.BitsPerSecond < 1e6 {
		t.Fatalf("veth iperf3 %.0f bit/s", r.BitsPerSecond)
	}
	sp, err := Sockperf(t, a, b, ipA, 1)
	if err != nil {
		t.Fatal(err)
	}
	if sp.P50 <= 0 || sp.P99 < sp.P50 {
		t.Fatalf("sockperf %+v", sp)
	}
	t.Logf("veth: iperf3 %.2f Gbit/s, sockperf %+v", r.BitsPerSecond/1e9, sp)
}

// TestCleanupRemovesNamespace checks that a namespace and the processes
// in it are gone once the subtest that made it ends.
func TestCleanupRemovesNamespace(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "sleep")
	var name string
	var pid int
	t.Run("inner", func(t *testing.T) {
		n := NewNetns(t, "c")
		name = n.Name
		pid = n.Start(t, "sleep", "60").Pid()
		if _, err := n.Run(200*time.Millisecond, "sleep", "5"); err == nil || !strings.Contains(err.Error(), "timed out") {
			t.Fatalf("Run did not time out: %v", err)
		}
	})
	if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
		t.Fatalf("namespace %s still there: %v", name, err)
	}
	if _, err := os.Stat("/proc/" + itoa(pid)); !os.IsNotExist(err) {
		t.Fatalf("process %d still there", pid)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
