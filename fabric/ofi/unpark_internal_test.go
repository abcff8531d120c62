//go:build ofi && cgo

package ofi

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestOpenUnparkable: before libfabric 1.19 every RDM entry of the "net"
// provider (libfabric's native TCP engine, alone or under rxm) has a
// no-op fi_trywait, so its completion queue's wait fd never stops being
// readable and a parked NIC would spin (two idle ofi:net NICs woke 1.3
// million times a second before Open refused them). Open must refuse
// such a provider by name and reason instead.
func TestOpenUnparkable(t *testing.T) {
	requireNet(t)
	nic, err := Open(Config{Provider: "net", Node: 1, Bind: "127.0.0.1:0"})
	if err == nil {
		nic.Close()
		t.Fatal("Open(net) succeeded; want ErrUnsupported")
	}
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "fi_trywait") {
		t.Fatalf("Open(net) = %v; want errors.ErrUnsupported naming fi_trywait", err)
	}
	// tcp (tcp;ofi_rxm in 1.17) is kept.
	in, err := getinfo("tcp", "127.0.0.1", "0", capMsg|capRMA|capSource, true, orderSAS)
	if err != nil {
		t.Fatalf("getinfo(tcp): %v", err)
	}
	in.free()
}

// TestUnarmedWaitFD is the NIC's own guard behind that filter, for a
// provider nobody has told exn about: with the filter off, two ofi:net
// NICs (whose fi_trywait never re-arms the CQ wait fd) must notice within
// unarmedFor, stop parking on the fd, and fall back to the
// timed poll, so an idle second costs a few ticks of CPU instead of two
// spinning cores, and traffic still flows.
func TestUnarmedWaitFD(t *testing.T) {
	requireNet(t)
	keepUnparkable(true)
	defer keepUnparkable(false)
	a, b := openPair(t, "net", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ea, eb, echo := EchoPair(t, ctx, a, b, 10)
	time.Sleep(400 * time.Millisecond) // ample for unarmedFor
	for _, n := range []*NIC{a, b} {
		if !n.WakeStats().WaitFDBroken {
			t.Errorf("node %d: the unarmed CQ wait fd was not noticed", n.id)
		}
	}
	t0 := testenv.CPUTicks(t)
	time.Sleep(time.Second)
	used := testenv.CPUTicks(t) - t0
	t.Logf("over 1s idle on the timed poll: %d ticks of CPU", used)
	if used > 30 { // spinning on the fd burned ~190
		t.Errorf("two idle ofi:net NICs used %d clock ticks of CPU in 1s", used)
	}
	echo(ea, eb) // the timed poll still delivers
}

// requireNet skips unless this libfabric has the 1.17 "net" provider
// (1.18 made that engine its tcp and has no net; 1.19 resets its wait in
// fi_trywait, so there is nothing to refuse).
func requireNet(t *testing.T) {
	t.Helper()
	major, minor := libVersion()
	if major > 1 || minor >= 18 {
		t.Skipf("libfabric %d.%d has no net provider", major, minor)
	}
	in, err := getinfo("net", "", "", 0, false, orderNone)
	if err != nil {
		t.Skipf("libfabric %d.%d offers no net provider: %v", major, minor, err)
	}
	in.free()
}
