package nstest

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/exn-project/exn/internal/testenv"
)

// BuildManyConns compiles shim/test/manyconns.c (many concurrent
// connections through the shim, issue #32) into a temporary directory.
func BuildManyConns(tb testing.TB) string {
	tb.Helper()
	prog := filepath.Join(tb.TempDir(), "manyconns")
	testenv.MustCC(tb, "-O2", "-Wall", "-Wextra", "-Werror", "-o", prog, testenv.ModulePath("shim", "test", "manyconns.c"))
	return prog
}

// ManyConns is what one manyconns run printed (the lines are in the
// program's head comment).
type ManyConns struct {
	// The counts line: a server's or a client's.
	Conns, Accepted, EMFILE, Switched, Bad, EpollErr int
	FDsBase, FDsOpen                                 int // the client's /proc/self/fd before and with all open
	// At the end: connections direct then (the client's after its
	// rounds, the server's at their close), and the client's
	// /proc/self/fd then.
	DirectEnd, FDsEnd int
	// A client's timed ping-pong (P > 0), ns.
	P50, P99 float64
	// A client's watched processes and /dev/shm ($MANYCONNS_WATCH):
	// before the first connection, with all open, and after the last
	// close once back within 10 % of the start (or after the program's
	// SETTLE_MS: SettleMS says how long it waited).
	Watch    []ManyConnsWatch
	ShmKiB   [3]float64
	SettleMS float64
	// $MANYCONNS_BULK: the bytes each connection echoed at once, /dev/shm
	// in use right after and once idle, and how long that took.
	Bulk, BulkKiB, BulkIdleKiB, BulkMS float64
}

// ManyConnsWatch is one watched process: before, with all open, after.
type ManyConnsWatch struct {
	PID         int
	FDs, RSSKiB [3]float64
}

// ParseManyConns reads manyconns' output; an error if it has no counts
// line or a malformed one.
func ParseManyConns(out string) (ManyConns, error) {
	var m ManyConns
	counts := false
	for _, l := range strings.Split(out, "\n") {
		var err error
		switch f := strings.Fields(l); {
		case len(f) > 0 && f[0] == "server":
			_, err = fmt.Sscanf(l, "server accepted %d emfile %d switched %d epoll_err %d", &m.Accepted, &m.EMFILE, &m.Switched, &m.EpollErr)
			counts = true
		case len(f) > 0 && f[0] == "client":
			_, err = fmt.Sscanf(l, "client conns %d emfile %d switched %d bad %d fds_base %d fds_open %d",
				&m.Conns, &m.EMFILE, &m.Switched, &m.Bad, &m.FDsBase, &m.FDsOpen)
			counts = true
		case len(f) > 0 && f[0] == "client_end":
			_, err = fmt.Sscanf(l, "client_end direct %d fds %d", &m.DirectEnd, &m.FDsEnd)
		case len(f) > 0 && f[0] == "server_end":
			_, err = fmt.Sscanf(l, "server_end direct %d", &m.DirectEnd)
		case len(f) > 0 && f[0] == "pingpong":
			var n int
			_, err = fmt.Sscanf(l, "pingpong n %d p50_ns %g p99_ns %g", &n, &m.P50, &m.P99)
		case len(f) > 0 && f[0] == "watch":
			var w ManyConnsWatch
			_, err = fmt.Sscanf(l, "watch %d fds %g %g rss_kib %g %g", &w.PID, &w.FDs[0], &w.FDs[1], &w.RSSKiB[0], &w.RSSKiB[1])
			m.Watch = append(m.Watch, w)
		case len(f) > 0 && f[0] == "watch_after":
			var pid int
			var fds, rss float64
			if _, err = fmt.Sscanf(l, "watch_after %d fds %g rss_kib %g", &pid, &fds, &rss); err == nil {
				err = fmt.Errorf("pid %d not watched", pid)
				for i := range m.Watch {
					if m.Watch[i].PID == pid {
						m.Watch[i].FDs[2], m.Watch[i].RSSKiB[2], err = fds, rss, nil
					}
				}
			}
		case len(f) > 0 && f[0] == "shm":
			_, err = fmt.Sscanf(l, "shm used_kib %g %g", &m.ShmKiB[0], &m.ShmKiB[1])
		case len(f) > 0 && f[0] == "bulk":
			_, err = fmt.Sscanf(l, "bulk bytes %g used_kib %g idle_kib %g ms %g", &m.Bulk, &m.BulkKiB, &m.BulkIdleKiB, &m.BulkMS)
		case len(f) > 0 && f[0] == "shm_after":
			_, err = fmt.Sscanf(l, "shm_after used_kib %g ms %g", &m.ShmKiB[2], &m.SettleMS)
		}
		if err != nil {
			return m, fmt.Errorf("manyconns: line %q: %w", l, err)
		}
	}
	if !counts {
		return m, errors.New("manyconns: no counts line")
	}
	return m, nil
}
