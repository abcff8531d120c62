package integration

import (
	"testing"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// TestShimNet is issue #8's "EXT-DS runs through the library and through
// the shim" on the net fabric: two exnd nodes joined only by an underlay
// bridge (StartNetCluster), unmodified iperf3 and sockperf shimmed with
// libextds.so on both ends, and exnd's counters (as in TestShim) showing
// that the bytes went over EXT-DS, not TCP over exn0.
//
// The library is covered through exnd: the shim hands each connection to
// exnd, whose EXT-DS (extds.Device, extds.Conn) carries it over the net
// fabric. A separate Go program using the library directly is not
// possible here, because extds.AttachDevice (kernel bypass for an
// application process) needs the shm fabric (extds.ErrNoBypass); the
// library itself is fabric-agnostic and its conformance suite runs on the
// mem fabric.
func TestShimNet(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ss", "iperf3", "sockperf", "gcc")
	c := netShimCluster(t, nstest.Build(t), 53)
	ip := c.nodes[1].IP.String()
	srvEnv, cliEnv := c.env(1), c.env(0)

	t.Run("iperf3", func(t *testing.T) {
		var bytes, bps float64
		d := c.measure(t, func() { bytes, bps = c.iperf3(t, srvEnv, cliEnv, ip, 2) })
		t.Logf("iperf3 through the shim on net: %.2f Gbit/s", bps/1e9)
		overEXTDS(t, "iperf3 on net", d, bytes)
		// Both ends count each connection (control + 1 stream).
		if d.ConnsEXTDS < 4 || d.ConnsTCP != 0 {
			t.Errorf("%.0f EXT-DS and %.0f TCP connections, want at least 4 and 0", d.ConnsEXTDS, d.ConnsTCP)
		}
	})

	t.Run("sockperf-ping-pong", func(t *testing.T) {
		var out string
		d := c.measure(t, func() { out = c.sockperf(t, srvEnv, cliEnv, ip, "ping-pong", "e", 2) })
		p50, p99 := sockperfPercentiles(t, out)
		t.Logf("sockperf ping-pong through the shim on net: p50 %.2f us, p99 %.2f us; EXT-DS rx %.0f bytes, %.0f conns; exn0 %.0f bytes",
			p50, p99, d.ExtdsRx, d.ConnsEXTDS, d.TapBytes)
		if d.ConnsEXTDS < 2 || d.ExtdsRx < 100000 {
			t.Errorf("sockperf did not go over EXT-DS: %+v", d)
		}
		if d.TapBytes > d.ExtdsRx/10+1<<20 {
			t.Errorf("sockperf: %.0f bytes over exn0 against %.0f over EXT-DS", d.TapBytes, d.ExtdsRx)
		}
	})

	// For reference only (no bar, the machine is shared): the same two
	// runs unshimmed, as TCP over exn0 on the same cluster.
	t.Run("tcp-exn0-reference", func(t *testing.T) {
		var bytes, bps float64
		d := c.measure(t, func() { bytes, bps = c.iperf3(t, nil, nil, ip, 2) })
		p50, p99 := sockperfPercentiles(t, c.sockperf(t, nil, nil, ip, "ping-pong", "e", 2))
		t.Logf("unshimmed on net: iperf3 %.2f Gbit/s (%.0f bytes, EXT-DS conns %.0f); sockperf ping-pong p50 %.2f us, p99 %.2f us",
			bps/1e9, bytes, d.ConnsEXTDS, p50, p99)
	})
}

// netShimCluster starts two nodes of the exnd binary exnd, with the extra
// flags args, on a new net fabric in subnet (StartNetCluster), and makes
// them a shimCluster (newShimCluster).
func netShimCluster(t *testing.T, exnd string, subnet int, args ...string) *shimCluster {
	t.Helper()
	nc := nstest.StartNetCluster(t, exnd, subnet, []int{1, 2}, args...)
	return newShimCluster(t, exnd, [2]*nstest.Node{nc.Nodes[0], nc.Nodes[1]})
}
