//go:build ofi && cgo

package ofi_test

import (
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/ofi"
)

// bindFor is the local bind address a provider's test NICs use: tcp binds
// loopback with an ephemeral port; shm names itself.
func bindFor(provider string) string {
	if provider == "tcp" {
		return "127.0.0.1:0"
	}
	return ""
}

// factory builds n NICs on provider in this process and exchanges their
// fi_getname addresses, as a launcher would out of band.
func factory(provider string, tune func(*ofi.Config)) fabrictest.Factory {
	return func(t testing.TB, n int) []fabric.NIC {
		t.Helper()
		nics := make([]*ofi.NIC, n)
		out := make([]fabric.NIC, n)
		for i := range nics {
			cfg := ofi.Config{Provider: provider, Node: fabric.NodeID(i + 1), Bind: bindFor(provider)}
			if tune != nil {
				tune(&cfg)
			}
			nic, err := ofi.Open(cfg)
			if err != nil {
				t.Fatalf("open node %d on %s: %v", i+1, provider, err)
			}
			nics[i], out[i] = nic.(*ofi.NIC), nic
			t.Cleanup(func() { nic.Close() })
		}
		for i, a := range nics {
			name, err := a.Name()
			if err != nil {
				t.Fatal(err)
			}
			for j, b := range nics {
				if i != j {
					if err := b.AddPeer(a.Node(), name); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		return out
	}
}

func TestConformanceTCP(t *testing.T) { fabrictest.Run(t, factory("tcp", nil)) }
func TestConformanceSHM(t *testing.T) { fabrictest.Run(t, factory("shm", nil)) }

func BenchmarkFabricTCP(b *testing.B) { fabrictest.Bench(b, factory("tcp", nil)) }
func BenchmarkFabricSHM(b *testing.B) { fabrictest.Bench(b, factory("shm", nil)) }

// TestConformanceSmallWindow runs the suite on shm with a 16-credit window
// and 4-slot mailboxes, so credit returns, blocking and mailbox growth run
// constantly.
func TestConformanceSmallWindow(t *testing.T) {
	fabrictest.Run(t, factory("shm", func(c *ofi.Config) { c.Credits, c.MailboxSlots = 16, 4 }))
}
