package mem_test

import (
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/mem"
)

// factory builds n NICs, nodes 1..n, of a fresh cluster. Mailboxes are
// kept at the default size so the suite also proves the default works.
func factory(opts ...mem.Option) fabrictest.Factory {
	return func(t testing.TB, n int) []fabric.NIC {
		t.Helper()
		return fabrictest.NICs(t, n, mem.NewCluster(opts...).NewNIC)
	}
}

func TestConformance(t *testing.T) { fabrictest.Run(t, factory()) }

// TestConformanceSmallMailbox runs the suite with 4-slot mailboxes, so the
// wrap-around and back-pressure paths run constantly.
func TestConformanceSmallMailbox(t *testing.T) { fabrictest.Run(t, factory(mem.WithMailboxSlots(4))) }

func BenchmarkFabric(b *testing.B) { fabrictest.Bench(b, factory()) }
