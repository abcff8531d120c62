//go:build ofi

package integration

import (
	"testing"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// ofiPort is where each node's libfabric tcp endpoint listens on the
// underlay (fabric/ofi DefaultPort).
const ofiPort = 7471

// TestOFIFabric runs EXT-Eth over real libfabric (provider tcp): two
// namespaces joined only by an underlay bridge, each running exnd with
// --fabric ofi:tcp and a peers file naming the underlay addresses. It
// checks exn0, ping both ways (a small frame on the eager path and a
// large one on the rendezvous path, RMA GET through fi_read), and
// unmodified iperf3 over exn0. Built only with -tags ofi (make ofi).
func TestOFIFabric(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "iperf3", "ping")
	exnd := nstest.Build(t)
	c := nstest.StartUnderlayCluster(t, exnd, "ofi:tcp", ofiPort, 31, []int{1, 2})
	a, b := c.Nodes[0], c.Nodes[1]

	var st struct {
		Fabric string `json:"fabric"`
	}
	if err := a.Call(&st, "status"); err != nil {
		t.Fatal(err)
	}
	if st.Fabric != "ofi:tcp" {
		t.Fatalf("status fabric = %q, want ofi:tcp", st.Fabric)
	}
	for _, size := range []int{56, 20000} {
		if _, err := nstest.Ping(a.NS, b.IP.String(), 3, size, "a5"); err != nil {
			t.Errorf("ping -s %d 1 -> 2: %v", size, err)
		}
		if _, err := nstest.Ping(b.NS, a.IP.String(), 3, size, "5a"); err != nil {
			t.Errorf("ping -s %d 2 -> 1: %v", size, err)
		}
	}
	r, err := nstest.Iperf3(t, b.NS, a.NS, b.IP.String(), 2)
	if err != nil {
		t.Fatalf("iperf3 over exn0 on ofi:tcp: %v", err)
	}
	if r.BitsPerSecond <= 0 {
		t.Fatalf("iperf3 moved nothing: %+v", r)
	}
	t.Logf("iperf3 over exn0 on ofi:tcp: %.2f Gbit/s", r.BitsPerSecond/1e9)
	if s := engineStats(t, a); s == nil {
		t.Fatal("no engine stats")
	}
}
