package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// RequirePrivileged skips t, with the reason, unless the process is root,
// /dev/net/tun exists and every named program is on PATH. When
// EXN_REQUIRE_PRIVILEGED=1 (as .ci/run sets it) it fails the test instead of
// skipping, so CI cannot pass by skipping.
func RequirePrivileged(t testing.TB, programs ...string) {
	t.Helper()
	reason := ""
	switch {
	case os.Geteuid() != 0:
		reason = "needs root"
	default:
		if _, err := os.Stat("/dev/net/tun"); err != nil {
			reason = "needs /dev/net/tun: " + err.Error()
		}
	}
	for _, p := range programs {
		if reason != "" {
			break
		}
		if _, err := exec.LookPath(p); err != nil {
			reason = "needs " + p + " on PATH (make deps installs it)"
		}
	}
	if reason == "" {
		return
	}
	Unavailable(t, reason)
}

// Unavailable skips t with reason (something a privileged test needs is
// missing, such as a tool that failed to build), or fails it when
// EXN_REQUIRE_PRIVILEGED=1, as RequirePrivileged does.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv("EXN_REQUIRE_PRIVILEGED") == "1" {
		t.Fatalf("privileged test cannot run (%s) and EXN_REQUIRE_PRIVILEGED=1", reason)
	}
	t.Skip(reason)
}

// Small reports whether tests should use small sizes (EXN_TEST_SMALL=1 or
// testing.Short()), as under the race detector.
func Small() bool { return testing.Short() || os.Getenv("EXN_TEST_SMALL") == "1" }

// EnvInt returns the positive integer the environment variable name holds
// (such as EXN_PERF_SECS), or def when it is unset or holds anything else.
func EnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// VerifyNoLeaks registers a cleanup that fails t if goroutines started
// during the test are still running when it ends.
func VerifyNoLeaks(t testing.TB) {
	t.Helper()
	opts := []goleak.Option{goleak.IgnoreCurrent(), memberlistProbe, memberlistFallback}
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// hashicorp/memberlist's Shutdown does not wait for a probe in flight
// (fabric/members, used by fabric/fabnet): its goroutine, and the TCP
// fallback probe it starts, end by themselves within one probe interval
// plus the stream timeout (members.Fabric). They are the library's, not
// ours; everything else memberlist runs stops with Shutdown.
var (
	memberlistProbe    = goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode")
	memberlistFallback = goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode.func1")
)

// CountFDs returns the number of open file descriptors of this process.
func CountFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count fds: %v", err)
	}
	return len(ents)
}

// VerifyNoFDLeaks fails t if the process has more open fds at the end of
// the test than at the start (with a small slack for runtime pollers).
func VerifyNoFDLeaks(t testing.TB) {
	t.Helper()
	before := CountFDs(t)
	t.Cleanup(func() {
		if after := CountFDs(t); after > before+2 {
			t.Errorf("fd leak: %d open at start, %d at end", before, after)
		}
	})
}
