package taplink

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/tap/taptest"
)

// frame is an Ethernet frame of size bytes from node src to node dst
// (EtherType 0x88B5, local experimental) with seq in its first payload
// bytes and a pattern after.
func frame(dst, src fabric.NodeID, size int, seq uint32) []byte {
	f := make([]byte, size)
	copy(f[0:6], fabric.DefaultMACPrefix.MAC(dst))
	copy(f[6:12], fabric.DefaultMACPrefix.MAC(src))
	f[12], f[13] = 0x88, 0xB5
	binary.BigEndian.PutUint32(f[14:18], seq)
	for i := 18; i < size; i++ {
		f[i] = byte(uint32(i)*31 + seq*7)
	}
	return f
}

// tapNode is one engine on a mem fabric whose link is a Link on an
// in-memory TAP.
type tapNode struct {
	dev  *taptest.Device
	link *Link
	eng  *exn.Engine
}

// startTapNode starts node id on c: TAP, Link, engine, reader. Cleanup
// closes them in the daemon's order (link, engine, NIC).
func startTapNode(t *testing.T, c *mem.Cluster, id fabric.NodeID) *tapNode {
	t.Helper()
	var ep fabric.Endpoint
	nic, err := c.NewNIC(id)
	if err == nil {
		ep, err = nic.Open(fabric.EthVPID)
	}
	if err != nil {
		t.Fatal(err)
	}
	n := &tapNode{dev: taptest.New("exnt", 0)}
	n.link = New(n.dev, Config{})
	if n.eng, err = exn.New(nic, ep, n.link, exn.Config{Offload: n.link.Offload()}); err != nil {
		t.Fatal(err)
	}
	if err := n.link.Start(n.eng); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.link.Close(); err != nil {
			t.Errorf("close link: %v", err)
		}
		if lent := n.eng.Stats().TxSlotsLent; lent != 0 {
			t.Errorf("after Close the reader still holds %d lent slots", lent)
		}
		n.eng.Close()
		nic.Close()
	})
	return n
}

// TestFramesFlow: frames injected on one node's TAP come out of the
// other's, both ways, eager and rendezvous sizes, in order; Close stops
// the readers (no goroutine left, every lent slot back).
func TestFramesFlow(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	a, b := startTapNode(t, c, 1), startTapNode(t, c, 2)
	if a.link.Offload() != 0 {
		t.Fatalf("Offload on a taptest device = %#x, want 0", a.link.Offload())
	}
	sizes := []int{60, 9000, 1500, 65535, 64}
	for _, dir := range []struct {
		name     string
		from, to *tapNode
		src, dst fabric.NodeID
	}{{"a to b", a, b, 1, 2}, {"b to a", b, a, 2, 1}} {
		t.Run(dir.name, func(t *testing.T) {
			var want [][]byte
			for i, size := range sizes {
				f := frame(dir.dst, dir.src, size, uint32(i))
				want = append(want, f)
				if err := dir.from.dev.Inject(f); err != nil {
					t.Fatal(err)
				}
			}
			for i, w := range want {
				got := testenv.Within(t, "frame", dir.to.dev.Written(), timeout)
				if !bytes.Equal(got, w) {
					t.Fatalf("frame %d: got %d bytes, want %d (seq %d)", i, len(got), len(w), i)
				}
			}
		})
	}
}
