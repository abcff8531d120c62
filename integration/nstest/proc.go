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
	return sumTasks(pid, "schedstat", func(s string) uint64 {
		f := strings.Fields(s)
		if len(f) == 0 {
			return 0
		}
		v, _ := strconv.ParseUint(f[0], 10, 64)
		return v
	})
}

// sumTasks sums value(text) over every thread of pid, text being the
// thread's /proc/PID/task/TID/name; a thread that exits meanwhile counts
// nothing.
func sumTasks(pid int, name string, value func(string) uint64) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/" + name)
		if err != nil {
			continue // the thread exited
		}
		sum += value(string(b))
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

// Use is one process's use of the machine over a window.
type Use struct {
	CPU    float64 // CPU time of all its threads, % of one core
	Sleeps float64 // voluntary context switches of all its threads, per second
}

// Usage measures each pid over d, in the order of pids. Sleeps counts
// how often the process's threads went to sleep, and so how often
// something woke them: on an idle process it is a far steadier figure
// than the CPU time, which moves with the VM's cost per wake-up
// (docs/membership.md, "Timer ticks and compression").
func Usage(pids []int, d time.Duration) ([]Use, error) {
	type sample struct{ cpu, sleeps uint64 }
	read := func(pid int) (sample, error) {
		cpu, err := CPUNanos(pid)
		if err != nil {
			return sample{}, err
		}
		sl, err := Sleeps(pid)
		return sample{cpu, sl}, err
	}
	t0 := make([]sample, len(pids))
	for i, pid := range pids {
		v, err := read(pid)
		if err != nil {
			return nil, err
		}
		t0[i] = v
	}
	start := time.Now()
	time.Sleep(d)
	el := time.Since(start)
	out := make([]Use, len(pids))
	for i, pid := range pids {
		v, err := read(pid)
		if err != nil {
			return nil, err
		}
		out[i] = Use{
			CPU:    float64(v.cpu-t0[i].cpu) / float64(el.Nanoseconds()) * 100,
			Sleeps: float64(v.sleeps-t0[i].sleeps) / el.Seconds(),
		}
	}
	return out, nil
}

// Sleeps is the number of voluntary context switches of every thread of
// pid (/proc/PID/task/*/status), each a sleep that something ended.
func Sleeps(pid int) (uint64, error) {
	return sumTasks(pid, "status", func(s string) uint64 {
		for _, line := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				return n
			}
		}
		return 0
	})
}
