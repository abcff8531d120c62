package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// upgradeTally is the last line of shim/test/upgrade.c.
type upgradeTally struct{ conns, direct, fails int }

func parseUpgradeTally(out string) (upgradeTally, error) {
	var u upgradeTally
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "conns ") {
			if _, err := fmt.Sscanf(l, "conns %d direct %d fails %d", &u.conns, &u.direct, &u.fails); err != nil {
				return u, fmt.Errorf("%q: %w", l, err)
			}
			return u, nil
		}
	}
	return u, fmt.Errorf("no tally line")
}

// TestShimUpgrade is issue #33's stress test of the mid-stream upgrade
// (EXTDS_SETUP=upgrade, docs/shim.md "Upgrade"): shim/test/upgrade.c
// makes 1,000 connections, 32 at a time, both ends under libextds.so on
// two exnd nodes of one shm fabric. Each carries up to 1 MiB each way in
// random write sizes with random pauses, half-closes each direction when
// it is done, and waits by blocking threads, poll or epoll; every byte is
// checked by content on both sides. Most connections must end direct,
// having moved in the middle of their streams, and exnd must have
// counted them.
func TestShimUpgrade(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "gcc")
	c := shmShimCluster(t, nstest.Build(t), 71, directArgs...)
	prog := filepath.Join(t.TempDir(), "upgrade")
	testenv.MustCC(t, "-O2", "-pthread", "-Wall", "-Wextra", "-Werror", "-o", prog, testenv.ModulePath("shim", "test", "upgrade.c"))
	ip := c.nodes[1].IP.String()
	port := nstest.PortArg()
	// EXN_UPGRADE_N sets the number of connections and
	// EXN_UPGRADE_DEBUG=1 adds EXTDS_DEBUG=1 on both ends: for debugging.
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("EXN_UPGRADE_N")); err == nil && v > 0 {
		n = v
	}
	extra := []string{"EXTDS_SETUP=upgrade"}
	if os.Getenv("EXN_UPGRADE_DEBUG") == "1" {
		extra = append(extra, "EXTDS_DEBUG=1", "UPGRADE_NOSIGPIPE=1")
	}
	before := [2]directCount{c.directCounts(t, 0), c.directCounts(t, 1)}
	srv := c.nodes[1].NS.StartEnv(t, c.env(1, extra...), prog, "server", ip, port)
	if err := c.nodes[1].NS.WaitListening(srv, port, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	out, cerr := c.nodes[0].NS.RunEnv(5*time.Minute, c.env(0, extra...), prog, "client", ip, port, fmt.Sprint(n), "32")
	serr := srv.Wait(60 * time.Second)
	lines := 40
	if os.Getenv("EXN_UPGRADE_DEBUG") == "1" {
		lines = 100000
	}
	t.Logf("client:\n%s\nserver:\n%s", tail(out, lines), tail(srv.Output(), lines))
	if cerr != nil {
		t.Errorf("client: %v", cerr)
	}
	if serr != nil {
		t.Errorf("server: %v", serr)
	}
	cu, err := parseUpgradeTally(out)
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	su, err := parseUpgradeTally(srv.Output())
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	if cu.fails != 0 || su.fails != 0 || cu.conns != n || su.conns != n {
		t.Errorf("client %+v, server %+v: want %d connections each, none failed", cu, su, n)
	}
	// Connections that end before UPG_AGE_NS (2 ms), or whose writes
	// all went out before both sides attached, stay TCP; the plans make
	// most of them live far longer. exnd counts each agreed upgrade once
	// per node; a program counts those whose descriptor was direct when
	// it closed (a side whose peer ended on TCP before moving stays TCP).
	after := [2]directCount{c.directCounts(t, 0), c.directCounts(t, 1)}
	for i := range after {
		t.Logf("node %d: %s", i+1, mustExnctl(t, c.exnctl, c.socks[i], "--json", "stats"))
		if t.Failed() || os.Getenv("EXN_UPGRADE_DEBUG") == "1" {
			t.Logf("node %d exnd:\n%s", i+1, tail(c.nodes[i].Proc.Output(), 60))
		}
		d := after[i].conns - before[i].conns
		t.Logf("node %d: direct connections +%.0f", i+1, d)
		if d < float64(n/2) || d < float64(max(cu.direct, su.direct)) {
			t.Errorf("node %d: direct connections +%.0f, want at least %d and what the programs saw (%d, %d)", i+1, d, n/2, cu.direct, su.direct)
		}
	}
	for who, u := range map[string]upgradeTally{"client": cu, "server": su} {
		if u.direct < n/3 {
			t.Errorf("%s: %d of %d connections ended direct, want at least a third", who, u.direct, u.conns)
		}
	}
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = append([]string{fmt.Sprintf("(%d lines before)", len(l)-n)}, l[len(l)-n:]...)
	}
	return strings.Join(l, "\n")
}
