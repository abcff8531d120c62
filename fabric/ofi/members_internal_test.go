//go:build ofi && cgo

package ofi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/internal/testenv"
)

// TestMembershipFindsSilentPeer: two tcp nodes with membership. Node 2's
// membership stops without a word while its provider endpoint stays
// open and nobody sends (a frozen idle host: the backend's own liveness
// never learns of it); node 1's membership declares it dead and the
// backend marks it down: Alive, Peers and a Send all say ErrPeerDown.
func TestMembershipFindsSilentPeer(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ps := []peers.Peer{{Node: 1, Addr: testenv.FreeAddr(t)}, {Node: 2, Addr: testenv.FreeAddr(t)}}
	var nics [2]*NIC
	for i := range nics {
		n, err := open(Config{Provider: "tcp", Node: fabric.NodeID(i + 1), Peers: ps, Liveness: LivenessSWIM})
		if err != nil {
			t.Fatalf("open node %d: %v", i+1, err)
		}
		t.Cleanup(func() { n.Close() })
		nics[i] = n
	}
	for _, n := range nics {
		testenv.Eventually(t, "membership converged", 10*time.Second, func() bool {
			r, ok := n.MembershipStats()
			return ok && r.Members.Alive == 2
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := fabrictest.OpenEP(t, nics[0], 1), fabrictest.OpenEP(t, nics[1], 1)
	fabrictest.SendRecv(t, ctx, a, b)

	nics[1].members.Close() // no leave: node 1 must find out
	testenv.Eventually(t, "node 2 down at node 1", 10*time.Second, func() bool {
		return errors.Is(nics[0].Alive(2), fabric.ErrPeerDown)
	})
	if p := nics[0].Peers(); len(p) != 0 {
		t.Errorf("Peers() = %v after node 2 was declared dead", p)
	}
	if r, _ := nics[0].MembershipStats(); r.DeclaredDead != 1 || r.Transport.Out == 0 {
		t.Errorf("node 1's membership: %+v", r)
	}
	if _, err := a.Send(ctx, []fabric.Message{{Peer: b.Addr(), Len: 1}}); !errors.Is(err, fabric.ErrPeerDown) {
		t.Errorf("send to a peer declared dead: %v, want ErrPeerDown", err)
	}
}

// TestMembershipNeedsIP: membership refuses a peers file whose
// addresses are not IP literals, naming the cause.
func TestMembershipNeedsIP(t *testing.T) {
	ps := []peers.Peer{{Node: 1, Addr: testenv.FreeAddr(t)}, {Node: 2, Addr: "localhost:7471"}}
	n, err := open(Config{Provider: "tcp", Node: 1, Peers: ps, Liveness: LivenessSWIM})
	if err == nil {
		n.Close()
		t.Fatal("membership opened with a host name in the peers file")
	}
	if !errors.Is(err, fabric.ErrInvalid) {
		t.Errorf("error %v, want ErrInvalid", err)
	}
}
