package integration

// Direct connections across hosts (issue #38, docs/direct.md "Across
// hosts") when a node dies or its exnd restarts: two exnd nodes of a net
// fabric (startSafetyOn), forksrv streaming from node 2 to node 1 over a
// direct connection, each node's copy of the buffer joined by its exnd's
// engine.

import (
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/fabric/fabnet"
	"github.com/exn-project/exn/integration/nstest"
)

// directNetResetBound is how soon a direct connection across hosts must
// fail after its peer's exnd died: fabnet declares a silent peer down
// after DefaultDeadAfter (at once if its TCP session closes), and the
// engine polls the fabric's view every DefaultLivenessPeriod (fabnet
// announces no peer changes); one second more for a loaded 2-core host.
const directNetResetBound = fabnet.DefaultDeadAfter + rdirect.DefaultLivenessPeriod + time.Second

// directLongClient starts the 1 TiB transfer (longClient) and checks
// that both nodes hold it as a direct connection with bytes arriving.
func (c *safetyCluster) directLongClient(t *testing.T, port string) *nstest.Proc {
	t.Helper()
	cli := c.longClient(t, port)
	for i := range c.nodes {
		if n := c.metric(t, i, "exn_shim_direct_active_connections"); n != 1 {
			t.Fatalf("node %d: %.0f direct connections open, want 1: %s", i+1, n, cli.Output())
		}
	}
	if in := c.metric(t, 0, "exn_shim_direct_bytes_total", `direction="in"`); in == 0 {
		t.Fatalf("node 1: no direct bytes in yet: %s", cli.Output())
	}
	return cli
}

// wantReset waits for the long client cli to fail after its peer's exnd
// went at t0: with ECONNRESET ("Connection reset by peer", forksrv's
// strerror) within directNetResetBound. It returns the delay.
func wantReset(t *testing.T, cli *nstest.Proc, t0 time.Time, what string) time.Duration {
	t.Helper()
	err := cli.Wait(directNetResetBound + 10*time.Second)
	took := time.Since(t0)
	out := strings.TrimSpace(cli.Output())
	t.Logf("%s: the client exited %v later (bound %v): %v: %s", what, took.Round(time.Millisecond), directNetResetBound, err, out)
	switch {
	case err == nil || strings.Contains(err.Error(), "still running"):
		t.Fatalf("%s: the open direct connection did not fail: %v", what, err)
	case !strings.Contains(out, "Connection reset by peer"):
		t.Errorf("%s: want ECONNRESET on the client, got: %s", what, out)
	case took > directNetResetBound:
		t.Errorf("%s: the client failed after %v, want within %v", what, took.Round(time.Millisecond), directNetResetBound)
	}
	return took
}

// directReleased waits until node i's exnd holds no direct connection
// any more (its engine let go of the reset one).
func (c *safetyCluster) directReleased(t *testing.T, i int) {
	t.Helper()
	if err := nstest.Eventually(5*time.Second, func() error {
		if n := c.metric(t, i, "exn_shim_direct_active_connections"); n != 0 {
			return fmt.Errorf("node %d: %.0f direct connections still open", i+1, n)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestDirectNetPeerKilled: the whole server node dies under a direct
// transfer across hosts: node 2's exnd gets SIGKILL, then (once it is
// gone, so nobody there stores fin) the server program. The client on
// node 1 must fail with ECONNRESET within directNetResetBound, reset by
// node 1's engine when the fabric declares node 2 down, and node 1's
// exnd must release the connection. "kill": the kernel closes node 2's
// fabric sessions (node 1 sees them end at once); "silent": node 2's
// underlay link goes down first, as at a power loss, so node 1 has only
// the missing heartbeats.
func TestDirectNetPeerKilled(t *testing.T) {
	for i, mode := range []string{"kill", "silent"} {
		t.Run(mode, func(t *testing.T) {
			c := startSafetyOn(t, "net", 45+i*9, [2]string{"all", "all"})
			s, port := c.server(t, "setuid", 1, c.shim(1))
			cli := c.directLongClient(t, port)
			if mode == "silent" {
				c.nodes[1].NS.MustRun(t, 5*time.Second, "ip", "link", "set", "ul0", "down")
			}
			t0 := time.Now()
			if err := c.nodes[1].Proc.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = c.nodes[1].Proc.Wait(5 * time.Second)
			if err := s.Kill(); err != nil {
				t.Fatal(err)
			}
			wantReset(t, cli, t0, "node 2 killed ("+mode+")")
			c.directReleased(t, 0)
			if c.nodes[0].Proc.Exited() {
				t.Errorf("node 1's exnd exited: %s", tailStr(c.nodes[0].Proc.Output()))
			}
		})
	}
}

// TestDirectNetRestart is TestSafetyRestart for a direct connection
// across hosts: the server node's exnd alone is stopped (SIGTERM: its
// engine resets and tells the peer; SIGKILL: node 1 finds node 2 down)
// under an open direct transfer; the client fails with ECONNRESET within
// directNetResetBound and node 1 releases the connection. Once exnd is
// back (the listener restored from its state file), new connections to
// the server that kept running are direct again on both nodes.
func TestDirectNetRestart(t *testing.T) {
	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			c := startSafetyOn(t, "net", 56+i, [2]string{"all", "all"})
			_, port := c.server(t, "setuid", 2, c.shim(1))
			c.client(t, port, 64<<10, 3)
			cli := c.directLongClient(t, port)
			pid := c.nodes[1].Proc.Pid()
			t0 := time.Now()
			if err := c.nodes[1].Proc.Signal(sig); err != nil {
				t.Fatal(err)
			}
			wantReset(t, cli, t0, "exnd 2 "+sig.String())
			c.directReleased(t, 0)
			c.restart(t, 1)
			// A dead exnd leaves no buffer behind: across hosts they
			// have no names (extds/shimsrv/dpool.go).
			if m, _ := filepath.Glob(fmt.Sprintf("/dev/shm/exn-net%d-*", pid)); len(m) != 0 {
				t.Errorf("exnd 2 (pid %d) left %d files in /dev/shm: %v", pid, len(m), m)
			}
			var b [2]float64
			for n := range b {
				b[n] = c.metric(t, n, "exn_shim_direct_total")
			}
			c.client(t, port, 64<<10, 3)
			for n := range b {
				if d := c.metric(t, n, "exn_shim_direct_total") - b[n]; d != 3 {
					t.Errorf("node %d: after the restart %.0f of 3 connections to the running server were direct", n+1, d)
				}
			}
		})
	}
}
