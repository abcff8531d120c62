package nstest

// Readers of /proc for the processes the tests start: their CPU time,
// resident set and the processes of a namespace.

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// CPUTicks returns utime+stime of pid in clock ticks, from /proc/PID/stat.
func CPUTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesised comm; utime and stime are fields 14
	// and 15 of the whole line, 12 and 13 after ") ".
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad times", pid)
	}
	return u + st, nil
}

// CPUNanos is the CPU time of every thread of pid, in ns
// (/proc/PID/task/*/schedstat: more precise than /proc/PID/stat's ticks).
func CPUNanos(pid int) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) > 0 {
			v, _ := strconv.ParseUint(f[0], 10, 64)
			sum += v
		}
	}
	return sum, nil
}

// pidsNamed lists the processes of the namespace whose comm is name.
func (n *Netns) pidsNamed(name string) []int {
	out, err := exec.Command("ip", "netns", "pids", n.Name).Output()
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			continue
		}
		if comm, err := os.ReadFile("/proc/" + f + "/comm"); err == nil && strings.TrimSpace(string(comm)) == name {
			pids = append(pids, pid)
		}
	}
	return pids
}

// RSSKiB returns pid's resident set in KiB (/proc/PID/status VmRSS).
func RSSKiB(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// CPUShare measures each pid's CPU time over d and returns it as a
// percentage of one core, in the order of pids.
func CPUShare(pids []int, d time.Duration) ([]float64, error) {
	t0 := make([]uint64, len(pids))
	for i, pid := range pids {
		v, err := CPUNanos(pid)
		if err != nil {
			return nil, err
		}
		t0[i] = v
	}
	start := time.Now()
	time.Sleep(d)
	el := time.Since(start)
	out := make([]float64, len(pids))
	for i, pid := range pids {
		v, err := CPUNanos(pid)
		if err != nil {
			return nil, err
		}
		out[i] = float64(v-t0[i]) / float64(el.Nanoseconds()) * 100
	}
	return out, nil
}
