package integration

// The hardened control socket of issue #18, against a running exnd: bad,
// oversized and truncated messages, too many descriptors, clients that
// connect and never speak, clients killed in the middle of a request, and
// 1000 concurrent clients. Each gets a clear error line or is closed, each
// is counted in exnd's /metrics (exn_control_*), exnd stays up, and its
// open descriptors (/proc/PID/fd) come back to what they were.

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/integration/nstest"
)

// ctlDie is a client that starts a request and is killed before it ends
// it (EXNT_CTL_DIE=partial: half a line; =fds: descriptors, no newline),
// run by TestMain in the re-executed test binary.
func ctlDie(mode string) {
	{
		c, err := net.Dial("unix", os.Getenv("EXNT_CTL"))
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		uc := c.(*net.UnixConn)
		if mode == "fds" {
			_, _, err = uc.WriteMsgUnix([]byte("shim-connect"), syscall.UnixRights(0, 1), nil)
		} else {
			_, err = uc.Write([]byte("shim-hel"))
		}
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("sent")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
}

// fdCount is the number of descriptors process pid has open.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	es, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// ctlExchange writes raw (with rights, if any) on a fresh connection to
// path, optionally half-closes, and returns every response line until
// exnd closes the connection or wait passes.
func ctlExchange(t *testing.T, path string, raw []byte, rights []byte, closeWrite bool, wait time.Duration) []string {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if len(raw) > 0 || rights != nil {
		if _, _, err := uc.WriteMsgUnix(raw, rights, nil); err != nil {
			t.Fatal(err)
		}
	}
	if closeWrite {
		_ = uc.CloseWrite()
	}
	_ = uc.SetReadDeadline(time.Now().Add(wait))
	var lines []string
	r := bufio.NewReader(uc)
	for {
		l, err := r.ReadString('\n')
		if l != "" {
			lines = append(lines, strings.TrimSpace(l))
		}
		if err != nil {
			return lines
		}
	}
}

func TestSafetyControl(t *testing.T) {
	c := startSafety(t, 62, [2]string{"all", "all"})
	n := c.nodes[1]
	pid := n.Proc.Pid()
	path := n.Control
	refused := func(reason string) float64 {
		return c.metric(t, 1, "exn_control_refused_total", `reason="`+reason+`"`)
	}
	before := map[string]float64{}
	reasons := []string{"bad_request", "oversized", "truncated", "too_many_fds", "idle"}
	for _, r := range reasons {
		before[r] = refused(r)
	}
	req0 := c.metric(t, 1, "exn_control_requests_total")
	acc0 := c.metric(t, 1, "exn_control_connections_total")
	fds0 := fdCount(t, pid)

	// Bad, oversized, truncated messages and too many descriptors.
	for _, tc := range []struct {
		name   string
		raw    string
		rights []byte
		want   []string // substrings of the response lines, in order
	}{
		{"unknown op", "bogus op\n", nil, []string{`unknown operation`}},
		{"empty line", "\n", nil, []string{`empty line`}},
		{"binary", "\x00\xff\xfe garbage\n", nil, []string{`unknown operation`}},
		{"bad then good", "\nstatus\n", nil, []string{`empty line`, `"ok":true`}},
		{"oversized", strings.Repeat("x", 5000), nil, []string{`longer than 4096`}},
		{"truncated", "status", nil, nil},
		{"too many fds", "status\n", syscall.UnixRights(tooManyFDs()...), []string{fmt.Sprintf("at most %d file descriptors", control.MaxFDs)}},
	} {
		lines := ctlExchange(t, path, []byte(tc.raw), tc.rights, true, 10*time.Second)
		if len(lines) != len(tc.want) {
			t.Errorf("%s: response %q, want %d lines", tc.name, lines, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("%s: line %d %q, want %q", tc.name, i, lines[i], w)
			}
		}
	}

	// Clients that connect and never speak: an idle error within the
	// line timeout (5 s), then closed.
	var wg sync.WaitGroup
	const silent = 20
	idleLines := make([][]string, silent)
	for i := range silent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idleLines[i] = ctlExchange(t, path, nil, nil, false, 15*time.Second)
		}()
	}
	// Clients killed in the middle of a request.
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"partial", "fds"} {
		p := n.NS.StartEnv(t, []string{"EXNT_CTL_DIE=" + mode, "EXNT_CTL=" + path}, bin)
		waitLine(t, p, "sent")
		if err := p.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = p.Wait(5 * time.Second)
	}
	wg.Wait()
	for i, l := range idleLines {
		if len(l) != 1 || !strings.Contains(l[0], "no complete line within") {
			t.Errorf("silent client %d: %q, want one idle error", i, l)
		}
	}

	// 1000 concurrent clients, all connected before any speaks.
	const many = 1000
	conns := make([]net.Conn, 0, many)
	for range many {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("client %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	var bad sync.Map
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			if _, err := c.Write([]byte("status\n")); err != nil {
				bad.Store(i, err.Error())
				return
			}
			l, err := bufio.NewReader(c).ReadString('\n')
			if err != nil || !strings.HasPrefix(l, `{"ok":true`) {
				bad.Store(i, fmt.Sprintf("%q %v", l, err))
			}
		}()
	}
	wg.Wait()
	nbad := 0
	bad.Range(func(k, v any) bool {
		if nbad++; nbad <= 5 {
			t.Errorf("concurrent client %v: %v", k, v)
		}
		return true
	})

	if n.Proc.Exited() {
		t.Fatalf("exnd exited: %s", n.Proc.Output())
	}
	// Counted: every refusal by reason, every request and connection.
	want := map[string]float64{"bad_request": 4, "oversized": 1, "truncated": 3, "too_many_fds": 1, "idle": silent}
	for _, r := range reasons {
		d := refused(r) - before[r]
		t.Logf("refused %s: +%.0f", r, d)
		if d < want[r] {
			t.Errorf("exn_control_refused_total{reason=%q} grew by %.0f, want >= %.0f", r, d, want[r])
		}
	}
	if d := c.metric(t, 1, "exn_control_requests_total") - req0; d < many {
		t.Errorf("exn_control_requests_total grew by %.0f, want >= %d", d, many)
	}
	if d := c.metric(t, 1, "exn_control_connections_total") - acc0; d < many+silent+9 {
		t.Errorf("exn_control_connections_total grew by %.0f, want >= %d", d, many+silent+9)
	}
	// No descriptor leaked: back to the count before, within a bounded
	// wait for exnd's closes.
	if err := nstest.Eventually(10*time.Second, func() error {
		if n := fdCount(t, pid); n != fds0 {
			t.Logf("exnd descriptors: %d (before: %d)", n, fds0)
			return fmt.Errorf("exnd has %d descriptors open, had %d", n, fds0)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	t.Logf("exnd descriptors before %d, after %d", fds0, fdCount(t, pid))
	if err := n.Call(nil, "status"); err != nil {
		t.Errorf("exnd after the flood: %v", err)
	}
}

// tooManyFDs is one descriptor more than a control request may carry.
func tooManyFDs() []int {
	fds := make([]int, control.MaxFDs+1)
	for i := range fds {
		fds[i] = i % 3
	}
	return fds
}
