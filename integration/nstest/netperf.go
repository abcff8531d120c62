package nstest

// netperf and netserver (the seed's benchmark, built by `make netperf`
// from the Makefile's NETPERF_SRC into build/netperf/) run
// unmodified inside the test's namespaces: netserver in the foreground
// (-D) as a Proc of the test, so it and the child it forks per test are
// killed by process group at cleanup, and netperf bounded by -l and a
// timeout, its result read from the omni output selectors (-o).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// NetperfDirEnv names the directory holding netperf and netserver; the
// default is build/netperf/ in the module (where `make netperf` puts them).
const NetperfDirEnv = "EXN_NETPERF_DIR"

// NetperfDir is where the harness looks for netperf and netserver.
func NetperfDir() string {
	if d := os.Getenv(NetperfDirEnv); d != "" {
		return d
	}
	return testenv.ModulePath("build", "netperf")
}

// Netperf returns the paths of netperf and netserver. When either is
// missing (not built, or the build failed) it skips t with the reason, or
// fails it under EXN_REQUIRE_PRIVILEGED=1 (testenv.Unavailable).
func Netperf(t testing.TB) (netperf, netserver string) {
	t.Helper()
	dir := NetperfDir()
	netperf, netserver = filepath.Join(dir, "netperf"), filepath.Join(dir, "netserver")
	for _, p := range []string{netperf, netserver} {
		if _, err := exec.LookPath(p); err != nil {
			testenv.Unavailable(t, fmt.Sprintf("needs %s (make netperf builds it from ../shared/tools/netperf; %s overrides the directory): %v",
				filepath.Base(p), NetperfDirEnv, err))
		}
	}
	return netperf, netserver
}

// StartNetserver starts `netserver -D -4 -p port` in ns with env (nil:
// none added) and waits until it listens. -D keeps it in the foreground
// as a Proc of the test: it still forks one child per control connection
// (same process group), and cleanup SIGKILLs the group by the server's
// PID even when the test fails.
func StartNetserver(t testing.TB, ns *Netns, netserver string, env []string, port int) *Proc {
	t.Helper()
	p := ns.StartEnv(t, env, netserver, "-D", "-4", "-p", strconv.Itoa(port))
	if err := ns.WaitListening(p, strconv.Itoa(port), 10*time.Second); err != nil {
		t.Fatalf("netserver: %v", err)
	}
	return p
}

// NetperfSelectors are the omni output selectors the harness asks for,
// in the order of NetperfResult's fields. Latencies are in microseconds;
// THROUGHPUT is 10^6 bits/s for streams and transactions/s for RR.
const NetperfSelectors = "THROUGHPUT,THROUGHPUT_UNITS,TRANSACTION_RATE,P50_LATENCY,P90_LATENCY,P99_LATENCY,MEAN_LATENCY,ELAPSED_TIME"

// NetperfResult is one netperf run's omni output.
type NetperfResult struct {
	Test       string
	Throughput float64 // 10^6 bits/s (streams) or transactions/s (RR)
	Unit       string  // "10^6bits/s" or "Trans/s"
	TransRate  float64 // transactions/s (RR; for streams, sends or receives/s)
	// Round-trip latency percentiles and mean of RR tests, microseconds.
	P50, P90, P99, Mean float64
	Elapsed             float64 // seconds
	Output              string  // everything netperf printed
}

// RR reports whether the test is a request/response test.
func (r NetperfResult) RR() bool {
	return strings.HasSuffix(r.Test, "_RR") || strings.HasSuffix(r.Test, "_CRR")
}

// Sane checks what every run must show, independent of timing: netperf
// printed its result line and nothing else (it reports failures such as
// "send_data: data send error" on extra lines), ran for a positive time,
// and measured a positive throughput; RR tests also a positive rate and
// ordered, positive latency percentiles.
func (r NetperfResult) Sane() error {
	lines := strings.Split(strings.TrimSpace(r.Output), "\n")
	switch {
	case len(lines) != 1:
		return fmt.Errorf("%s: want one result line, netperf printed %d: %s", r.Test, len(lines), tail(r.Output))
	case r.Elapsed <= 0:
		return fmt.Errorf("%s: elapsed time %v", r.Test, r.Elapsed)
	case !(r.Throughput > 0):
		return fmt.Errorf("%s: throughput %v %s", r.Test, r.Throughput, r.Unit)
	}
	if r.RR() {
		if r.Unit != "Trans/s" || !(r.TransRate > 0) {
			return fmt.Errorf("%s: %v %s, transaction rate %v", r.Test, r.Throughput, r.Unit, r.TransRate)
		}
		// Percentiles of 0 are under netperf's 1 µs resolution (parse).
		if !(r.P50 >= 0 && r.P50 <= r.P90 && r.P90 <= r.P99 && r.Mean > 0) {
			return fmt.Errorf("%s: latencies p50 %v p90 %v p99 %v mean %v us", r.Test, r.P50, r.P90, r.P99, r.Mean)
		}
	} else if r.Unit != "10^6bits/s" {
		return fmt.Errorf("%s: unit %q, want 10^6bits/s", r.Test, r.Unit)
	}
	return nil
}

// RunNetperf runs `netperf -H host -p port -l secs -t test -P 0 -- -o
// NetperfSelectors` in ns with env, bounded by secs plus 20 s, retrying a
// refused control connection briefly, and parses the result. It does not
// judge it (NetperfResult.Sane does).
func RunNetperf(ns *Netns, env []string, netperf, host string, port, secs int, test string) (NetperfResult, error) {
	args := []string{netperf, "-H", host, "-p", strconv.Itoa(port), "-l", strconv.Itoa(secs), "-t", test, "-P", "0",
		"--", "-o", NetperfSelectors}
	var (
		out string
		err error
	)
	for attempt := 0; attempt < 10; attempt++ {
		out, err = ns.RunEnv(time.Duration(secs)*time.Second+20*time.Second, env, args...)
		if err == nil || !strings.Contains(out, "Connection refused") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := NetperfResult{Test: test, Output: out}
	if err != nil {
		return r, fmt.Errorf("netperf -t %s to %s: %w: %s", test, host, err, tail(out))
	}
	if err := r.parse(); err != nil {
		return r, fmt.Errorf("netperf -t %s to %s: %w", test, host, err)
	}
	return r, nil
}

// parse reads the CSV line of NetperfSelectors (the last line printed).
func (r *NetperfResult) parse() error {
	lines := strings.Split(strings.TrimSpace(r.Output), "\n")
	f := strings.Split(strings.TrimSpace(lines[len(lines)-1]), ",")
	if len(f) != 8 {
		return fmt.Errorf("want 8 fields (%s), got %q", NetperfSelectors, tail(r.Output))
	}
	r.Unit = f[1]
	for i, v := range []*float64{&r.Throughput, nil, &r.TransRate, &r.P50, &r.P90, &r.P99, &r.Mean, &r.Elapsed} {
		if v == nil {
			continue
		}
		x, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return fmt.Errorf("field %d %q: %w", i+1, f[i], err)
		}
		if x == netperfBelowResolution && i >= 3 && i <= 5 {
			x = 0 // a percentile inside netperf's first histogram bucket: under 1 µs
		}
		*v = x
	}
	return nil
}

// netperfBelowResolution is what netperf's omni selectors print for a
// latency percentile that falls in its histogram's first bucket (under
// 1 µs: a direct connection's TCP_RR): INT_MIN, not a latency.
const netperfBelowResolution = -2147483648

// NetperfTests are the tests the harness runs: bulk both ways, TCP and
// UDP request/response, and connect/request/response/close.
var NetperfTests = []string{"TCP_STREAM", "TCP_MAERTS", "TCP_RR", "TCP_CRR", "UDP_RR"}

var shimBuilt testenv.Built

// BuildShimLib builds libextds.so (shim/Makefile, through
// testenv.CompileShim) once per test process into a temporary directory
// removed after the tests, and returns its path.
func BuildShimLib(t testing.TB) string {
	t.Helper()
	return buildOnce(t, &shimBuilt, "shim", func(dir string) (string, error) {
		lib := filepath.Join(dir, "libextds.so")
		return lib, testenv.CompileShim(lib)
	})
}

// StartNetserverDaemon starts netserver as users do, without -D: it
// listens, forks, and the parent exits while the child calls setsid()
// and serves, itself forking a child per test. It returns the daemon's
// PID, found among the namespace's processes once the parent has exited
// and the port is listening. Cleanup SIGKILLs the daemon's process group
// (its session: the daemon and its per-test children) by that PID, even
// when the test fails; the namespace's deletion is the second line.
func StartNetserverDaemon(t testing.TB, ns *Netns, netserver string, env []string, port int) int {
	t.Helper()
	before := map[int]bool{}
	for _, p := range ns.pidsNamed("netserver") {
		before[p] = true
	}
	// Not Run: it kills the process group when the command returns,
	// which could catch the daemon between fork and setsid. Output goes
	// to a file, not a pipe the daemon would hold open.
	logf, err := os.CreateTemp(t.TempDir(), "netserver")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := ns.command(ctx, env, netserver, "-4", "-p", strconv.Itoa(port))
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Run()
	b, _ := os.ReadFile(logf.Name())
	out := string(b)
	var pid int
	t.Cleanup(func() {
		if pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err != nil {
		t.Fatalf("netserver (daemonizing): %v: %s", err, out)
	}
	if err := Eventually(10*time.Second, func() error {
		for _, p := range ns.pidsNamed("netserver") {
			if !before[p] {
				pid = p
			}
		}
		if pid == 0 {
			return fmt.Errorf("no new netserver process in %s", ns.Name)
		}
		o, err := ns.Run(5*time.Second, "ss", "-Hltn", "sport = :"+strconv.Itoa(port))
		if err != nil || !strings.Contains(o, ":"+strconv.Itoa(port)) {
			return fmt.Errorf("netserver pid %d: nothing listens on %d yet: %v", pid, port, err)
		}
		return nil
	}); err != nil {
		t.Fatalf("netserver (daemonizing): %v: %s", err, out)
	}
	return pid
}
