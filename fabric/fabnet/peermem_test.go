package fabnet

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
)

// BenchmarkPeerMemory reports what a peer costs a node under lazy
// sessions (issue #36): per known peer (an entry of the peers table that
// is never used: 1,024 entries against 16) and per active peer (a
// session to it: one node talks to 8 others; the heap and goroutines of
// both ends, halved). Run once: go test -run '^$' -bench PeerMemory
// -benchtime 1x ./fabric/fabnet/ (docs/fabric-net.md "Memory per peer").
func BenchmarkPeerMemory(b *testing.B) {
	for range b.N {
		known := (knownHeap(b, 1024) - knownHeap(b, 16)) / (1024 - 16)
		heap, gs, first, asked, again := activeCost(b, 8)
		b.ReportMetric(known, "B/known-peer")
		b.ReportMetric(heap, "B/active-peer")
		b.ReportMetric(gs, "goroutines/active-peer")
		b.ReportMetric(float64(first.Microseconds()), "µs-first-send")
		b.ReportMetric(float64(asked.Microseconds()), "µs-first-send-asked")
		b.ReportMetric(float64(again.Microseconds()), "µs-next-send")
	}
}

func heapNow() float64 {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc)
}

// knownHeap is the heap one NIC adds with a table of k peers, none
// reachable (port 1 refuses: membership's join fails at once).
func knownHeap(b *testing.B, k int) float64 {
	peers := make(map[fabric.NodeID]string, k)
	for i := 2; i <= k; i++ {
		peers[fabric.NodeID(i)] = "127.0.0.1:1"
	}
	ln := listen(b)
	peers[1] = ln.Addr().String()
	before := heapNow()
	n, err := open(Config{Node: 1, Listener: ln, Peers: peers, Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the first join attempt is over
	after := heapNow()
	n.Close()
	return after - before
}

// activeCost starts 1+a nodes, lets membership settle, and measures the
// heap and goroutines that node 1's first message to each of the a
// others adds (a sessions, two ends each), and the median time of such
// a first message's round (send, the other end has it) against one on
// another VPID pair of the same two nodes afterwards (a first credit
// grant in both, the session in the first only). asked is the same
// first round from the highest node to the others but node 1: lower
// nodes, so each session comes by a dial request.
func activeCost(b *testing.B, a int) (heap, goroutines float64, first, asked, again time.Duration) {
	lns := make([]net.Listener, 1+a)
	addrs := map[fabric.NodeID]string{}
	for i := range lns {
		lns[i] = listen(b)
		addrs[fabric.NodeID(i+1)] = lns[i].Addr().String()
	}
	nics := make([]*NIC, len(lns))
	eps := make([]fabric.Endpoint, len(lns))
	for i := range nics {
		n, err := open(Config{Node: fabric.NodeID(i + 1), Listener: lns[i], Peers: addrs, Logger: testLogger()})
		if err != nil {
			b.Fatal(err)
		}
		nics[i] = n
		defer n.Close()
		eps[i] = fabrictest.OpenEP(b, n, 5)
	}
	waitMembers(b, nics)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g0, h0 := runtime.NumGoroutine(), heapNow()
	var firsts []time.Duration
	for _, ep := range eps[1:] {
		t0 := time.Now()
		fabrictest.SendRecv(b, ctx, eps[0], ep)
		firsts = append(firsts, time.Since(t0))
	}
	for _, n := range nics[1:] {
		if s := n.NetStats().Sessions; s != 1 {
			b.Fatal(fmt.Sprintf("node %d: %d sessions, want 1", n.id, s))
		}
	}
	h1, g1 := heapNow(), runtime.NumGoroutine()
	var agains []time.Duration
	for i, n := range nics[1:] {
		from, to := fabrictest.OpenEP(b, nics[0], fabric.VPID(6+i)), fabrictest.OpenEP(b, n, fabric.VPID(6+i))
		t0 := time.Now()
		fabrictest.SendRecv(b, ctx, from, to)
		agains = append(agains, time.Since(t0))
	}
	var askeds []time.Duration
	for _, ep := range eps[1:a] {
		t0 := time.Now()
		fabrictest.SendRecv(b, ctx, eps[a], ep)
		askeds = append(askeds, time.Since(t0))
	}
	med := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
	return (h1 - h0) / float64(2*a), float64(g1-g0) / float64(2*a), med(firsts), med(askeds), med(agains)
}
