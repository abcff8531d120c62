//go:build ofi && cgo

package ofi_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/ofi"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/internal/testenv"
)

func TestOpenMissingProvider(t *testing.T) {
	openRefused(t, ofi.Config{Provider: "nosuchprovider", Node: 1}, nil, `"nosuchprovider" not found`, "available:", "tcp")
	openRefused(t, ofi.Config{Node: 1}, fabric.ErrInvalid) // no provider
}

// TestOpenProviderWithoutRDM runs Open("udp") in a child process whose
// libfabric has the ofi_rxd utility provider filtered out (FI_PROVIDER is
// read once per process): bare udp offers only datagram endpoints without
// FI_RMA, and Open must say so instead of failing later.
func TestOpenProviderWithoutRDM(t *testing.T) {
	if os.Getenv("EXN_OFI_CHILD") == "udp" {
		_, err := ofi.Open(ofi.Config{Provider: "udp", Node: 1})
		if err == nil {
			os.Stdout.WriteString("OPENED\n")
			return
		}
		os.Stdout.WriteString("ERR " + err.Error() + "\n")
		return
	}
	out, err := testenv.HelperCommand("TestOpenProviderWithoutRDM", "EXN_OFI_CHILD=udp", "FI_PROVIDER=^ofi_rxd").Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ERR ") || !strings.Contains(string(out), "FI_EP_RDM") {
		t.Fatalf("Open(udp) without ofi_rxd: want an error naming FI_EP_RDM, child said:\n%s", out)
	}
}

// TestUnreachablePeer: node 2 is in the peers file at a port nobody
// listens on. A send to it returns ErrPeerDown (not a hang, not a crash),
// Alive reports it, and RMA to it becomes an NErrPeerDown notification.
func TestUnreachablePeer(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ps := []peers.Peer{
		{Node: 1, Addr: testenv.FreeAddr(t)},
		{Node: 2, Addr: testenv.FreeAddr(t)},
	}
	nic, err := ofi.Open(ofi.Config{Provider: "tcp", Node: 1, Peers: ps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	ep := fabrictest.OpenEP(t, nic, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	m := fabric.Message{Peer: fabric.Addr{Node: 2, VPID: 1}, Len: 8}
	_, err = ep.Send(ctx, []fabric.Message{m})
	if !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("send to an unreachable peer: %v, want ErrPeerDown", err)
	}
	t.Logf("send failed after %v: %v", time.Since(start), err)
	if err := nic.Alive(2); !errors.Is(err, fabric.ErrPeerDown) {
		t.Errorf("Alive(2) = %v, want ErrPeerDown", err)
	}
	if got := nic.Peers(); len(got) != 0 {
		t.Errorf("Peers() = %v, want none up", got)
	}
	reg := fabrictest.Register(t, ep, 4096)
	if _, err := ep.Post([]fabric.RMA{{Op: fabric.OpGet, Peer: m.Peer, Local: reg.NLA, Remote: fabric.MakeNLA(1, 0), Len: 64}}); err != nil {
		t.Fatal(err)
	}
	ns := make([]fabric.Notification, 1)
	fabrictest.PollWait(t, ctx, ep, ns)
	if ns[0].Kind != fabric.KindRequester || ns[0].Err != fabric.NErrPeerDown {
		t.Fatalf("rma to an unreachable peer: %+v, want requester NErrPeerDown", ns[0])
	}
	if st := nic.Stats(); st.PeerDown == 0 || st.NotifyErrPeerDown == 0 {
		t.Errorf("faults not counted: %+v", st)
	}
}

// TestZeroAllocVELO: a VELO send and receive between two nodes allocates
// nothing once the pair is open.
func TestZeroAllocVELO(t *testing.T) {
	for _, prov := range []string{"shm", "tcp"} {
		t.Run(prov, func(t *testing.T) {
			nics := factory(prov, nil)(t, 2)
			a := fabrictest.OpenEP(t, nics[0], 1)
			b := fabrictest.OpenEP(t, nics[1], 1)
			out := []fabric.Message{{Peer: b.Addr(), Len: fabric.MaxVELOPayload}}
			in := make([]fabric.Message, 1)
			ctx := context.Background()
			round := func() {
				if _, err := a.Send(ctx, out); err != nil {
					t.Fatal(err)
				}
				fabrictest.RecvWait(t, ctx, b, in)
			}
			round() // opens the pair
			if avg := testing.AllocsPerRun(500, round); avg > 0.05 {
				t.Fatalf("%.2f allocations per message, want 0", avg)
			}
		})
	}
}
