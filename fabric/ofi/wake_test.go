//go:build ofi && cgo

package ofi_test

// Wake-ups across processes and idle parks: the two-process ping-pong
// that `make bench-ofi` measures, its wake-up test, and the idle check.

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/ofi"
	"github.com/exn-project/exn/internal/testenv"
)

// Environment of the echo child of BenchmarkPingPong2Proc.
const (
	echoProvEnv = "EXN_OFI_ECHO_PROVIDER" // provider; set only in the child
	echoPeerEnv = "EXN_OFI_ECHO_PEER"     // the parent's fi_getname, hex
	echoNamePfx = "EXN-OFI-ECHO-NAME "    // the child's fi_getname line on stdout
)

// TestHelperOFIEcho is the child process of BenchmarkPingPong2Proc: node
// 2, VPID 1, echoing every message back to its sender until stdin
// closes. It does nothing unless echoProvEnv is set.
func TestHelperOFIEcho(t *testing.T) {
	prov := os.Getenv(echoProvEnv)
	if prov == "" {
		t.Skip("helper process of BenchmarkPingPong2Proc")
	}
	parent, err := hex.DecodeString(os.Getenv(echoPeerEnv))
	if err != nil {
		t.Fatal(err)
	}
	n, ep, name := openNamed(t, prov, 2)
	if err := n.AddPeer(1, parent); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s%x\n", echoNamePfx, name)
	go func() { // the parent closes our stdin (or dies): stop
		b := make([]byte, 1)
		os.Stdin.Read(b)
		ep.Close()
	}()
	fabrictest.Echo(ep)
}

// openNamed opens node on prov and its VPID 1, both closed when tb ends,
// and returns the NIC's fi_getname address, which the other process adds
// as its peer.
func openNamed(tb testing.TB, prov string, node fabric.NodeID) (*ofi.NIC, fabric.Endpoint, []byte) {
	tb.Helper()
	nic, err := ofi.Open(ofi.Config{Provider: prov, Node: node, Bind: bindFor(prov)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nic.Close() })
	n := nic.(*ofi.NIC)
	ep := fabrictest.OpenEP(tb, nic, 1)
	name, err := n.Name()
	if err != nil {
		tb.Fatal(err)
	}
	return n, ep, name
}

// BenchmarkPingPong2Proc measures VELO one-way latency (half the round
// trip of a 120 B message, p50 and p99) between this process and an echo
// child process, each with its own NIC: the figure `make bench-ofi`
// compares with fi_pingpong.
func BenchmarkPingPong2Proc(b *testing.B) {
	for _, prov := range []string{"shm", "tcp"} {
		b.Run(prov, func(b *testing.B) { benchPingPong2Proc(b, prov) })
	}
}

// startEcho opens node 1 on prov in this process and an echo child
// process as node 2 (TestHelperOFIEcho), and returns node 1's VPID 1.
// The child is stopped, and waited for, when tb ends.
func startEcho(tb testing.TB, prov string) fabric.Endpoint {
	tb.Helper()
	n, ep, name := openNamed(tb, prov, 1)
	var child []byte
	// Registered before the helper, so it runs after the helper's
	// cleanup has killed the child, if it had to: a child killed before
	// its NIC's Close leaves its files in /dev/shm.
	tb.Cleanup(func() {
		for _, f := range ofi.HostFiles(child) { // none without a child
			os.Remove(f)
		}
	})
	_, stdin, stdout := testenv.StartPipedHelper(tb, "TestHelperOFIEcho", echoProvEnv+"="+prov, echoPeerEnv+"="+hex.EncodeToString(name))
	exited := make(chan struct{})
	// Closing stdin stops the child, which closes its NIC and exits (its
	// stdout then ends). Wait for that before tb's cleanup kills it: a
	// child killed inside its NIC's Close leaves the shm provider's
	// region file in /dev/shm. (Cleanups run last-in first-out: this
	// one runs before StartPipedHelper's.)
	tb.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second): // a hang detector; the helper's cleanup kills it
		}
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), echoNamePfx); ok {
			var err error
			if child, err = hex.DecodeString(h); err != nil {
				tb.Fatal(err)
			}
			break
		}
	}
	if child == nil {
		tb.Fatal("echo child printed no address")
	}
	go func() { // drain the rest of the child's output, until it exits
		defer close(exited)
		for sc.Scan() {
		}
	}()
	if err := n.AddPeer(2, child); err != nil {
		tb.Fatal(err)
	}
	return ep
}

// TestWakeAcrossProcesses ping-pongs with an echo child process with
// pauses between rounds long enough for both sides to stop spinning and
// park (the background goroutines on their host bells on shm, on the CQ
// wait fd on tcp), so every round needs a cross-process wake-up, and the
// pauses vary so sends race the parks. Nothing but a wake-up ends a park
// (no deadline): a lost one leaves a round waiting, and the round's bound
// fails the test.
func TestWakeAcrossProcesses(t *testing.T) {
	rounds := 200
	if testenv.Small() {
		rounds = 40
	}
	for _, prov := range []string{"shm", "tcp"} {
		t.Run(prov, func(t *testing.T) {
			ep := startEcho(t, prov)
			rng := rand.New(rand.NewPCG(1, 2))
			out := []fabric.Message{{Peer: fabric.Addr{Node: 2, VPID: 1}, Tag: 1, Len: 8}}
			in := make([]fabric.Message, 1)
			for i := range rounds {
				// 0-3 ms: from racing the spin's end to well past it.
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := ep.Send(ctx, out); err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
				if _, err := fabrictest.AwaitRecv(ctx, ep, in); err != nil {
					t.Fatalf("round %d: no echo: %v (a lost wake-up)", i, err)
				}
				cancel()
			}
		})
	}
}

func benchPingPong2Proc(b *testing.B, prov string) {
	ep := startEcho(b, prov)
	out := []fabric.Message{{Peer: fabric.Addr{Node: 2, VPID: 1}, Tag: 1, Len: fabric.MaxVELOPayload}}
	in := make([]fabric.Message, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	round := func() {
		if _, err := ep.Send(ctx, out); err != nil {
			b.Fatal(err)
		}
		if _, err := fabrictest.AwaitRecv(ctx, ep, in); err != nil {
			b.Fatal(err)
		}
	}
	const warmup = 1000 // connection set-up, credit query, caches
	for range warmup {
		round()
	}
	lat := make([]int64, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range lat {
		t0 := time.Now()
		round()
		lat[i] = int64(time.Since(t0)) / 2
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
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
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b, echo := ofi.EchoPair(t, ctx, nics[0], nics[1], 100)
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
	w0, t0 := wakes(), testenv.CPUTicks(t)
	time.Sleep(idle)
	used, woke := testenv.CPUTicks(t)-t0, wakes()-w0
	t.Logf("over %v idle: %d ticks of CPU, %d background wake-ups", idle, used, woke)
	if used > 15 { // 15 % of a core at 100 ticks/s; a spinning park burns ~100
		t.Errorf("two idle ofi:%s NICs used %d clock ticks of CPU in %v: a park does not sleep", prov, used, idle)
	}
	for _, n := range nics {
		if n.(*ofi.NIC).WakeStats().WaitFDBroken {
			t.Errorf("ofi:%s NIC %d gave up parking on its wait fd (a working provider re-arms it)", prov, n.Node())
		}
	}
	if woke != 0 {
		t.Errorf("two idle ofi:%s NICs' background goroutines woke %d times in %v; want 0", prov, woke, idle)
	}
	// The bell still works after the idle second: a message wakes the
	// parked side.
	echo(a, b)
}
