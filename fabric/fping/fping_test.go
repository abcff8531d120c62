package fping

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

func newService(t testing.TB, c *mem.Cluster, node fabric.NodeID) (fabric.NIC, *Service) {
	t.Helper()
	nic, err := c.NewNIC(node)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := nic.Open(VPID)
	if err != nil {
		t.Fatal(err)
	}
	s := New(ep, nil)
	t.Cleanup(func() { s.Close(); nic.Close() })
	return nic, s
}

func TestPing(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	_, a := newService(t, c, 1)
	bNIC, _ := newService(t, c, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := 0; i < 10; i++ {
		rtt, err := a.Ping(ctx, 2)
		if err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
		if rtt <= 0 || rtt > time.Second {
			t.Fatalf("ping %d: implausible rtt %v", i, rtt)
		}
	}

	// A node with no responder: the VPID is not open, so Send fails.
	if _, err := a.Ping(ctx, 3); !errors.Is(err, fabric.ErrUnknownNode) {
		t.Errorf("ping unknown node: err = %v, want ErrUnknownNode", err)
	}
	// A node that went down answers with ErrPeerDown, promptly.
	bNIC.Close()
	start := time.Now()
	if _, err := a.Ping(ctx, 2); err == nil {
		t.Error("ping of a closed node succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("ping of a closed node took %v", d)
	}
}
