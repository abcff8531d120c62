package backend

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/fabric/shm"
	"github.com/exn-project/exn/internal/testenv"
)

// pingPong opens VPID 0 on a and b and sends one VELO message a -> b.
func pingPong(t *testing.T, a, b fabric.NIC) {
	t.Helper()
	ea, err := a.Open(fabric.EthVPID)
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	eb, err := b.Open(fabric.EthVPID)
	if err != nil {
		t.Fatal(err)
	}
	defer eb.Close()
	var m [1]fabric.Message
	m[0].Peer = fabric.Addr{Node: b.Node(), VPID: fabric.EthVPID}
	_ = m[0].SetPayload([]byte("hello"))
	if _, err := ea.Send(context.Background(), m[:]); err != nil {
		t.Fatal(err)
	}
	var got [1]fabric.Message
	fabrictest.RecvWait(t, context.Background(), eb, got[:])
	if string(got[0].Payload()) != "hello" || got[0].Peer.Node != a.Node() {
		t.Fatalf("got %q from %v", got[0].Payload(), got[0].Peer)
	}
}

func TestOpenMem(t *testing.T) {
	c := mem.NewCluster()
	a, err := Open("mem", 1, Options{Mem: c})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open("mem", 2, Options{Mem: c})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pingPong(t, a, b)
}

func TestOpenSHM(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SHM: []shm.Option{shm.WithDir(dir)}}
	a, err := Open("shm:backendtest", 1, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open("shm:backendtest", 2, opts)
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	pingPong(t, a, b)
	if a.Node() != 1 || b.Node() != 2 {
		t.Fatalf("nodes %d, %d", a.Node(), b.Node())
	}
	a.Close()
	b.Close()
	// Closed NICs leave at most the fabric-wide file behind.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "exn-backendtest-fabric" {
			t.Errorf("file %s left after Close", e.Name())
		}
	}
}

func TestOpenNet(t *testing.T) {
	addrA, addrB := testenv.FreeAddr(t), testenv.FreeAddr(t)
	ps := []peers.Peer{{Node: 1, Addr: addrA}, {Node: 2, Addr: addrB}}
	a, err := Open("net:"+addrA, 1, Options{Peers: ps})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open("net:"+addrB, 2, Options{Peers: ps})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// The nodes connect in the background; wait until each sees the other.
	deadline := time.Now().Add(10 * time.Second)
	for a.Alive(2) != nil || b.Alive(1) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("net nodes never connected: %v, %v", a.Alive(2), b.Alive(1))
		}
		time.Sleep(10 * time.Millisecond)
	}
	pingPong(t, a, b)
}
