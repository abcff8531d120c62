//go:build ofi && cgo

package ofi

import (
	"testing"

	"github.com/exn-project/exn/fabric"
)

// TestForgedSource feeds node 2 packets from node 1's libfabric address
// that claim to come from node 3, and a VELO message without a credit
// account: both are dropped and counted, nothing reaches the mailbox.
func TestForgedSource(t *testing.T) {
	_, n2 := openPair(t, "shm", 0)
	ep, err := n2.Open(5)
	if err != nil {
		t.Fatal(err)
	}
	fa := n2.peer(1).fa
	pkt := make([]byte, headerSize+8)
	before := n2.Stats().Corrupt
	putHeader(pkt, header{typ: pVELO, desc: fabric.Descriptor{Node: 3, VPID: 1, Len: 8}, dst: 5, epoch: ep.(*endpoint).epoch}.encode())
	n2.receive(pkt, fa)
	putHeader(pkt, header{typ: pVELO, desc: fabric.Descriptor{Node: 1, VPID: 1, Len: 8}, dst: 5, epoch: ep.(*endpoint).epoch}.encode())
	n2.receive(pkt, fa) // right source, but it never opened the pair
	n2.receive(pkt, 12345)
	if got := n2.Stats().Corrupt - before; got != 3 {
		t.Errorf("Corrupt rose by %d, want 3", got)
	}
	if k, _ := ep.Recv(make([]fabric.Message, 4)); k != 0 {
		t.Fatalf("%d forged messages delivered", k)
	}
}
