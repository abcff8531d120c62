//go:build ofi && cgo

package ofi_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/ofi"
)

// cpuTicks is this process's user+system CPU time in clock ticks
// (/proc/self/stat fields 14 and 15).
func cpuTicks(t testing.TB) int64 {
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

// TestIdleHoldsNoCore checks that two NICs that have exchanged traffic
// (VELO both ways and an RMA GET and PUT, so connections, send slots and
// the provider's queues have all been used) park once idle, on each
// provider's wait: ofi:tcp in the netpoller on the CQ wait fd, ofi:shm on
// its host bell (hostbell.go), both with no deadline, so an idle second
// costs no more than a few ticks of CPU. A park that returned at once (a
// wait fd left readable, a trywait that never arms) would spin and burn
// the whole second. Nor may the background goroutines wake at all while
// idle: on shm the timed poll the bell replaced woke up to 1000 times a
// second.
func TestIdleHoldsNoCore(t *testing.T) {
	for _, prov := range []string{"tcp", "shm"} {
		t.Run(prov, func(t *testing.T) { testIdle(t, prov) })
	}
}

func testIdle(t *testing.T, prov string) {
	nics := factory(prov, nil)(t, 2)
	a := fabrictest.OpenEP(t, nics[0], 1)
	b := fabrictest.OpenEP(t, nics[1], 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	echo := func(from, to fabric.Endpoint) {
		if _, err := from.Send(ctx, []fabric.Message{{Peer: to.Addr(), Len: 4}}); err != nil {
			t.Fatal(err)
		}
		var m [1]fabric.Message
		fabrictest.RecvWait(t, ctx, to, m[:])
	}
	for range 100 {
		echo(a, b)
		echo(b, a)
	}
	la := fabrictest.Register(t, a, 1<<20)
	rb := fabrictest.Register(t, b, 1<<20)
	for _, op := range []fabric.Op{fabric.OpGet, fabric.OpPut} {
		if _, err := a.Post([]fabric.RMA{{Op: op, Peer: b.Addr(), Local: la.NLA, Remote: rb.NLA, Len: 1 << 20, Notify: fabric.NotifyRequester}}); err != nil {
			t.Fatal(err)
		}
		var ns [1]fabric.Notification
		fabrictest.PollWait(t, ctx, a, ns[:])
		if ns[0].Err != fabric.NErrNone {
			t.Fatalf("%v: %v", op, ns[0].Err)
		}
	}
	time.Sleep(50 * time.Millisecond) // let spins end and both sides park
	wakes := func() (w uint64) {
		for _, n := range nics {
			w += n.(*ofi.NIC).WakeStats().BackgroundWakes
		}
		return w
	}
	const idle = time.Second
	w0, t0 := wakes(), cpuTicks(t)
	time.Sleep(idle)
	used, woke := cpuTicks(t)-t0, wakes()-w0
	t.Logf("over %v idle: %d ticks of CPU, %d background wake-ups", idle, used, woke)
	if used > 15 { // 15 % of a core at 100 ticks/s; a spinning park burns ~100
		t.Errorf("two idle ofi:%s NICs used %d clock ticks of CPU in %v: a park does not sleep", prov, used, idle)
	}
	if woke != 0 {
		t.Errorf("two idle ofi:%s NICs' background goroutines woke %d times in %v; want 0", prov, woke, idle)
	}
	// The bell still works after the idle second: a message wakes the
	// parked side.
	echo(a, b)
}
