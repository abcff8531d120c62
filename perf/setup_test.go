package perf

import (
	"testing"

	"github.com/exn-project/exn/integration/nstest"
)

// pair is the setup most perf benchmarks share: a veth pair between two
// namespaces (the kernel baseline) and two exnd nodes on one shm fabric,
// each in a namespace of its own, with ARP warmed up on both paths.
type pair struct {
	va, vb *nstest.Netns // the veth pair's ends
	vethB  string        // vb's address
	n1, n2 *nstest.Node  // the exnd nodes, 1 and 2
}

// newPair builds a pair: the veth on 10.x.vethSubnet, the nodes on
// 10.77.nodeSubnet. Cleanup is the harness's (namespaces, processes,
// shm files).
func newPair(b *testing.B, vethSubnet, nodeSubnet int) pair {
	b.Helper()
	p := pair{va: nstest.NewNetns(b, "va"), vb: nstest.NewNetns(b, "vb")}
	_, p.vethB = nstest.Veth(b, p.va, p.vb, vethSubnet)
	exnd := nstest.Build(b)
	fab := nstest.ShmFabric(b)
	p.n1 = nstest.StartNode(b, exnd, fab, nodeSubnet, 1)
	p.n2 = nstest.StartNode(b, exnd, fab, nodeSubnet, 2)
	// ARP both ways on both paths (exnd's neighbour table learns node
	// 2's address, which EXT-DS's resolver needs).
	if _, err := nstest.Ping(p.va, p.vethB, 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	if _, err := nstest.Ping(p.n1.NS, p.n2.IP.String(), 2, 56, ""); err != nil {
		b.Fatal(err)
	}
	return p
}
