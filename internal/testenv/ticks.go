package testenv

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// CPUTicks returns this process's user+system CPU time in clock ticks
// (USER_HZ, 100 a second on Linux) from /proc/self/stat; it skips the
// test where there is no /proc. Tests that a parked goroutine holds no
// core compare two readings around an idle interval.
func CPUTicks(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skipf("no /proc/self/stat: %v", err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // field 3 onwards
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	k, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parse /proc/self/stat: %q", s)
	}
	return u + k
}
