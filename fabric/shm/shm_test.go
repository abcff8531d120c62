package shm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

var fabricSeq atomic.Int64

// uniqueFabric returns a fabric name no other test (or test process) uses
// and registers a cleanup that fails the test if any of its files remain,
// after removing them so a failing test leaves /dev/shm clean.
func uniqueFabric(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), fabricSeq.Add(1))
	t.Cleanup(func() {
		left := fabricFiles(t, name)
		for _, f := range left {
			os.Remove(f)
		}
		if len(left) > 0 {
			t.Errorf("fabric %s left files behind: %v", name, left)
		}
	})
	return name
}

func fabricFiles(t testing.TB, name string) []string {
	m, err := filepath.Glob(filepath.Join("/dev/shm", "exn-"+name+"-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// factory opens n NICs, nodes 1..n, of a fresh fabric in this process.
func factory(opts ...Option) fabrictest.Factory {
	return func(t testing.TB, n int) []fabric.NIC {
		t.Helper()
		name := uniqueFabric(t)
		return fabrictest.NICs(t, n, func(id fabric.NodeID) (fabric.NIC, error) { return Open(name, id, opts...) })
	}
}

// nodeOne opens node 1 of a new fabric fab and its VPID 1 (ep), both
// closed at the end of the test.
func nodeOne(t testing.TB, opts ...Option) (fab string, nic fabric.NIC, ep fabric.Endpoint) {
	t.Helper()
	fab = uniqueFabric(t)
	nic = openNIC(t, fab, 1, opts...)
	return fab, nic, fabrictest.OpenEP(t, nic, 1)
}

func TestConformance(t *testing.T) { fabrictest.Run(t, factory()) }

// TestConformanceSmallRings runs the suite with 2-slot mailboxes, so the
// wrap-around and back-pressure paths run constantly.
func TestConformanceSmallRings(t *testing.T) { fabrictest.Run(t, factory(WithSlots(2))) }

func BenchmarkFabric(b *testing.B) { fabrictest.Bench(b, factory()) }

func TestOpenValidation(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name string
		fab  string
		opts []Option
	}{
		{"empty", "", nil},
		{"slash", "a/b", nil},
		{"dash", "a-b", nil},
		{"dotdot", "..", nil},
		{"long", strings.Repeat("x", maxFabricName+1), nil},
		{"slots", "ok", []Option{WithSlots(3)}},
		{"depth", "ok", []Option{WithNotifyDepth(16)}},
		{"dir", "ok", []Option{WithDir("")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if nic, err := Open(tt.fab, 1, tt.opts...); err == nil {
				nic.Close()
				t.Fatal("Open succeeded")
			}
		})
	}
}
