package shimsrv

import (
	"net/netip"
	"testing"
)

func TestCovers(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		bound, local string
		want         bool
	}{
		{"0.0.0.0", "10.0.0.1", true},
		{"10.0.0.1", "10.0.0.1", true},
		{"10.0.0.1", "127.0.0.1", false}, // same port, another address: another socket
		{"10.0.0.1", "::ffff:10.0.0.1", false},
		{"0.0.0.0", "fd77::1", false},
		{"::", "fd77::1", true},
		{"::", "::ffff:10.0.0.1", true}, // dual-stack [::] accepts v4-mapped
		{"::", "10.0.0.1", false},       // an AF_INET socket came from an AF_INET listener
		{"fd77::1", "fd77::1", true},
		{"fd77::1", "fd77::2", false},
		{"", "10.0.0.1", true}, // restored from an older state file: unknown
	} {
		var b netip.Addr
		if tc.bound != "" {
			b = a(tc.bound)
		}
		if got := covers(b, a(tc.local)); got != tc.want {
			t.Errorf("covers(%s, %s) = %v, want %v", tc.bound, tc.local, got, tc.want)
		}
	}
}
