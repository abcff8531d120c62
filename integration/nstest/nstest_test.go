package nstest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
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

// TestSweepStale: files of a fabric whose test process is gone are
// removed; files of a live one (this process) are kept.
func TestSweepStale(t *testing.T) {
	const deadPid = 4194303 // pid_max's ceiling: never a live process here
	if syscall.Kill(deadPid, 0) != syscall.ESRCH {
		t.Skip("pid 4194303 exists")
	}
	dead := "/dev/shm/exn-" + ShmPrefix + strconv.Itoa(deadPid) + "_f1-fabric"
	live := "/dev/shm/exn-" + ShmPrefix + strconv.Itoa(os.Getpid()) + "_f999-fabric"
	other := "/dev/shm/exn-exntx" + strconv.Itoa(deadPid) + "_f1-fabric" // not ours
	for _, f := range []string{dead, live, other} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Skipf("no /dev/shm: %v", err)
		}
		t.Cleanup(func() { os.Remove(f) })
	}
	sweepStale()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("stale %s not swept: %v", dead, err)
	}
	for _, f := range []string{live, other} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s swept: %v", f, err)
		}
	}
}

// TestUsage: a process that sleeps and wakes a hundred times a second
// and one that sleeps throughout are told apart by their sleeps per
// second, and neither takes a whole core.
func TestUsage(t *testing.T) {
	start := func(script string) int {
		t.Helper()
		cmd := exec.Command("sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	waker := start("while :; do sleep 0.01; done")
	idle := start("exec sleep 30")
	time.Sleep(100 * time.Millisecond) // past both programs' start
	uses, err := Usage([]int{waker, idle}, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("waker %+v, idle %+v", uses[0], uses[1])
	if w := uses[0]; w.Sleeps < 20 || w.CPU >= 100 {
		t.Errorf("waker: %+v, want ≥ 20 sleeps/s and under a core", w)
	}
	if i := uses[1]; i.Sleeps > 4 || i.CPU > 5 {
		t.Errorf("idle: %+v, want ≤ 4 sleeps/s and next to no CPU", i)
	}
	if _, err := Usage([]int{1 << 30}, time.Millisecond); err == nil {
		t.Error("Usage of a pid that does not exist: no error")
	}
}
