//go:build ofi && cgo

package ofi

import (
	"errors"
	"strings"
	"testing"
)

// TestOpenUnparkable: before libfabric 1.19 every RDM entry of the "net"
// provider (libfabric's native TCP engine, alone or under rxm) has a
// no-op fi_trywait, so its completion queue's wait fd never stops being
// readable and a parked NIC would spin (two idle ofi:net NICs woke 1.3
// million times a second before Open refused them). Open must refuse
// such a provider by name and reason instead.
func TestOpenUnparkable(t *testing.T) {
	major, minor := libVersion()
	if major > 1 || minor >= 19 {
		t.Skipf("libfabric %d.%d: fi_trywait resets the native TCP engine's wait", major, minor)
	}
	if major == 1 && minor >= 18 {
		t.Skipf("libfabric %d.%d has no net provider (its tcp is that engine)", major, minor)
	}
	if in, err := getinfo("net", "", "", 0, false, orderNone); err != nil {
		t.Skipf("libfabric %d.%d offers no net provider: %v", major, minor, err)
	} else {
		in.free()
	}
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
