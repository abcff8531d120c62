package ofi

import (
	"slices"
	"strings"
	"testing"
)

func TestHostFiles(t *testing.T) {
	for _, tc := range []struct {
		name     string
		provider string // the provider region's file, or "" for none
	}{
		{"fi_shm://10581:0:0\x00", "/dev/shm/10581:0:0"},
		{"fi_ns://10.78.33.1:7471\x00", "/dev/shm/10.78.33.1:7471"},
		{"fi_ns://10.78.33.1:7471", "/dev/shm/10.78.33.1:7471"},
		{"fi_shm://../etc/x\x00", ""}, // no path out of /dev/shm
		{"fi_shm://\x00", ""},
		{"\x02\x00\x1d\x2f\x7f\x00\x00\x01", ""}, // a sockaddr (tcp): bell only
	} {
		got := HostFiles([]byte(tc.name))
		if len(got) < 2 || !strings.HasPrefix(got[0], "/dev/shm/exn-ofi-") || !strings.HasSuffix(got[0], ".word") ||
			got[1] != strings.TrimSuffix(got[0], ".word")+".bell" {
			t.Errorf("%q: bell files %q", tc.name, got)
			continue
		}
		var want []string
		if tc.provider != "" {
			want = []string{tc.provider}
		}
		if !slices.Equal(got[2:], want) {
			t.Errorf("%q: provider files %q, want %q", tc.name, got[2:], want)
		}
	}
	if a, b := HostFiles([]byte("fi_shm://1:0:0\x00")), HostFiles([]byte("fi_shm://1:0:1\x00")); a[0] == b[0] {
		t.Errorf("two NICs share a bell: %q", a[0])
	}
}
