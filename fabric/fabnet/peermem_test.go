package fabnet

import (
	"context"
	"fmt"
	"net"
	"runtime"
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
		heap, gs := activeCost(b, 8)
		b.ReportMetric(known, "B/known-peer")
		b.ReportMetric(heap, "B/active-peer")
		b.ReportMetric(gs, "goroutines/active-peer")
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
// others adds: a sessions, two ends each.
func activeCost(b *testing.B, a int) (heap, goroutines float64) {
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
	for _, ep := range eps[1:] {
		fabrictest.SendRecv(b, ctx, eps[0], ep)
	}
	for _, n := range nics[1:] {
		if s := n.NetStats().Sessions; s != 1 {
			b.Fatal(fmt.Sprintf("node %d: %d sessions, want 1", n.id, s))
		}
	}
	h1, g1 := heapNow(), runtime.NumGoroutine()
	return (h1 - h0) / float64(2*a), float64(g1-g0) / float64(2*a)
}
