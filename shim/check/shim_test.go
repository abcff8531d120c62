package check

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/internal/testenv"
)

// binDir holds the C programs the tests build, each once per test
// process on first use; TestMain makes it and removes it.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "extds-shim-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var shimBuilt testenv.Built

// build compiles libextds.so and shimtest into binDir.
func build(t testing.TB) (lib, prog string) {
	t.Helper()
	testenv.NeedGCC(t)
	lib = filepath.Join(binDir, "libextds.so")
	prog = shimBuilt.Path(t, func() (string, error) {
		prog := filepath.Join(binDir, "shimtest")
		if err := testenv.CompileShim(lib); err != nil {
			return "", err
		}
		return prog, testenv.CC("-O2", "-pthread", "-Wall", "-Werror", "-o", prog, testenv.ModulePath("shim", "test", "shimtest.c"))
	})
	return lib, prog
}

// localIP returns a non-loopback address of this host (the shim skips
// loopback destinations), or skips the test.
func localIP(t testing.TB) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	t.Skip("no non-loopback IPv4 address on this host")
	return ""
}

var portSeq atomic.Int32

// port returns a port below the ephemeral range (32768-60999), so no
// client's source port can hold it.
func port() int { return 20000 + (os.Getpid()%120)*100 + int(portSeq.Add(1))%100 }

// fakeExnd is a control server speaking the shim protocol: it splices
// each connection it is handed onto a socketpair, transparently, and
// counts the bytes, so a test can tell they went through the switch.
type fakeExnd struct {
	path string
	srv  *control.Server
	mode atomic.Value // "extds", "tcp" or "error" for connect and accept

	mu       sync.Mutex
	ops      []string // every request line seen
	wg       sync.WaitGroup
	bytes    atomic.Int64
	nextID   atomic.Uint64
	switched atomic.Int64
}

type shimReply struct {
	Mode   string `json:"mode"`
	ID     uint64 `json:"id,omitempty"`
	Reason string `json:"reason,omitempty"`
}

func newFake(t *testing.T, mode string) *fakeExnd {
	t.Helper()
	f := &fakeExnd{path: filepath.Join(t.TempDir(), "exnd.sock"), srv: control.NewServer(nil)}
	f.mode.Store(mode)
	f.srv.Handle("shim-hello", func(_ context.Context, args []string) (any, error) {
		f.record("shim-hello", args)
		return map[string]int{"version": shimsrv.Version}, nil
	})
	f.srv.HandleFD("shim-listen", func(ctx context.Context, req *control.Request) (any, []*os.File, error) {
		f.record("shim-listen", req.Args)
		if _, ok := control.PeerFrom(ctx); !ok || len(req.Args) != 0 || len(req.Files) != 1 {
			return nil, nil, errors.New("want the listening socket and no arguments")
		}
		return struct{}{}, nil, nil
	})
	f.srv.Handle("shim-unlisten", func(_ context.Context, args []string) (any, error) {
		f.record("shim-unlisten", args)
		if len(args) != 1 {
			return nil, errors.New("want PORT")
		}
		return struct{}{}, nil
	})
	for _, op := range []string{"shim-connect", "shim-accept"} {
		f.srv.HandleFD(op, func(_ context.Context, req *control.Request) (any, []*os.File, error) {
			f.record(op, req.Args)
			// "direct" asks for a direct connection (docs/direct.md); this
			// fake relays, as an exnd that cannot do direct does.
			if len(req.Files) != 1 || len(req.Args) > 1 || (len(req.Args) == 1 && req.Args[0] != "direct") {
				return nil, nil, errors.New("want one descriptor and no argument but direct")
			}
			switch f.mode.Load().(string) {
			case "tcp":
				return shimReply{Mode: "tcp", Reason: "fake"}, nil, nil
			case "error":
				return nil, nil, errors.New("fake failure")
			}
			tcp, err := net.FileConn(req.Files[0])
			if err != nil {
				return nil, nil, err
			}
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				tcp.Close()
				return nil, nil, err
			}
			mine := os.NewFile(uintptr(fds[0]), "fake-splice")
			uc, err := net.FileConn(mine)
			mine.Close()
			if err != nil {
				tcp.Close()
				return nil, nil, err
			}
			f.splice(tcp.(*net.TCPConn), uc.(*net.UnixConn))
			f.switched.Add(1)
			return shimReply{Mode: "extds", ID: f.nextID.Add(1)}, []*os.File{os.NewFile(uintptr(fds[1]), "fake-app-end")}, nil
		})
	}
	if err := f.srv.Listen(f.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.srv.Close()
		f.wg.Wait()
	})
	return f
}

func (f *fakeExnd) record(op string, args []string) {
	f.mu.Lock()
	f.ops = append(f.ops, strings.Join(append([]string{op}, args...), " "))
	f.mu.Unlock()
}

func (f *fakeExnd) count(prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, o := range f.ops {
		if strings.HasPrefix(o, prefix) {
			n++
		}
	}
	return n
}

func (f *fakeExnd) opList() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.ops, "; ")
}

// splice copies both ways, passing half-closes on, and counts bytes.
func (f *fakeExnd) splice(tcp *net.TCPConn, uc *net.UnixConn) {
	var done sync.WaitGroup
	done.Add(2)
	f.wg.Add(1)
	cp := func(dst, src net.Conn, closeWrite func() error) {
		defer done.Done()
		io.Copy(counting(dst, &f.bytes), src)
		closeWrite()
	}
	go cp(tcp, uc, tcp.CloseWrite)
	go cp(uc, tcp, uc.CloseWrite)
	go func() {
		defer f.wg.Done()
		done.Wait()
		tcp.Close()
		uc.Close()
	}()
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// counting writes to w and counts in n as it writes, so a test can read
// the count while the splice is still running.
func counting(w io.Writer, n *atomic.Int64) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		k, err := w.Write(p)
		n.Add(int64(k))
		return k, err
	})
}

// env returns the environment of a shimmed program. These tests check
// the switch at connect and accept against a scripted exnd, so they ask
// for it (EXTDS_SETUP=connect) whichever the shim's default is; the
// upgrade is tested against real exnds (integration/upgrade_test.go)
// and its requests in TestCtlRequests.
func env(lib, ctl string, extra ...string) []string {
	return append(append(os.Environ(), "LD_PRELOAD="+lib, "EXTDS_CONTROL="+ctl, "EXTDS_SETUP=connect"), extra...)
}

// proc is a background program with its output.
type proc struct {
	cmd  *exec.Cmd
	out  *testenv.Output
	done chan error
}

func start(t *testing.T, envv []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(args[0], args[1:]...), out: &testenv.Output{}, done: make(chan error, 1)}
	p.cmd.Env = envv
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

func (p *proc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(d):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("%s: still running after %v; killed\n%s", p.cmd.Path, d, p.out.String())
	}
}

// waitOutput waits until the program printed s.
func (p *proc) waitOutput(t *testing.T, s string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !strings.Contains(p.out.String(), s) {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited (%v) before printing %q:\n%s", p.cmd.Path, err, s, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print %q in %v:\n%s", p.cmd.Path, s, d, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func run(t *testing.T, envv []string, d time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = envv
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// field returns the value of key=value in a shimtest line.
func field(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

func resultLine(out string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "MISMATCH") {
			return l
		}
	}
	return ""
}

// transfer runs a shimtest server (count connections) and one client per
// entry of clients ("nb" or ""), all with serverEnv / clientEnv, and
// returns the clients' result lines.
func transfer(t *testing.T, serverEnv, clientEnv []string, ip string, fork bool, size int, clients ...string) []string {
	t.Helper()
	_, prog := build(t)
	p := strconv.Itoa(port())
	args := []string{prog, "server", ip, p, strconv.Itoa(len(clients))}
	if fork {
		args = append(args, "fork")
	}
	srv := start(t, serverEnv, args...)
	srv.waitOutput(t, "listening", 10*time.Second)
	var lines []string
	for _, c := range clients {
		args := []string{prog, "client", ip, p, strconv.Itoa(size)}
		if c != "" {
			args = append(args, c)
		}
		out, err := run(t, clientEnv, 30*time.Second, args...)
		line := resultLine(out)
		if err != nil || !strings.HasPrefix(line, "ok ") {
			t.Fatalf("client %q: %v\n%s\nserver:\n%s", c, err, out, srv.out.String())
		}
		lines = append(lines, line)
	}
	if err := srv.wait(t, 10*time.Second); err != nil {
		t.Fatalf("server: %v\n%s", err, srv.out.String())
	}
	return lines
}

func TestPassthroughWithoutExnd(t *testing.T) {
	lib, _ := build(t)
	ip := localIP(t)
	e := env(lib, filepath.Join(t.TempDir(), "nothing.sock"), "EXTDS_DEBUG=1")
	for _, l := range transfer(t, e, e, ip, false, 3<<20+5, "", "nb") {
		if field(l, "kernel") != "inet" || field(l, "server-kernel") != "inet" || field(l, "cc") == "extds" {
			t.Errorf("want plain TCP on both ends: %s", l)
		}
	}
}

func TestModeOff(t *testing.T) {
	lib, _ := build(t)
	ip := localIP(t)
	f := newFake(t, "extds")
	e := env(lib, f.path, "EXTDS_MODE=off")
	for _, l := range transfer(t, e, e, ip, false, 1<<20, "", "nb") {
		if field(l, "kernel") != "inet" || field(l, "server-kernel") != "inet" {
			t.Errorf("want plain TCP: %s", l)
		}
	}
	if ops := f.opList(); ops != "" {
		t.Errorf("EXTDS_MODE=off talked to exnd: %s", ops)
	}
}

func TestLoopbackSkipped(t *testing.T) {
	lib, _ := build(t)
	f := newFake(t, "extds")
	e := env(lib, f.path)
	for _, l := range transfer(t, e, e, "127.0.0.1", false, 1<<20, "", "nb") {
		if field(l, "kernel") != "inet" || field(l, "server-kernel") != "inet" {
			t.Errorf("want plain TCP on loopback: %s", l)
		}
	}
	if n := f.count("shim-connect") + f.count("shim-accept") + f.count("shim-listen"); n != 0 {
		t.Errorf("loopback talked to exnd: %s", f.opList())
	}
}

// TestSwitch: both ends switch (the fake splices transparently); the
// forking server's children serve switched sockets; addresses, TCP_INFO,
// TCP_CONGESTION, SO_DOMAIN, O_NONBLOCK, epoll registrations and a dup
// carry over; only the listening process unregisters its port.
func TestSwitch(t *testing.T) {
	lib, _ := build(t)
	ip := localIP(t)
	f := newFake(t, "extds")
	e := env(lib, f.path, "EXTDS_DEBUG=1")
	const size = 5<<20 + 3
	lines := transfer(t, e, e, ip, true, size, "", "nb", "nb")
	for _, l := range lines {
		if field(l, "kernel") != "unix" || field(l, "server-kernel") != "unix" {
			t.Errorf("want both ends switched: %s", l)
		}
		if !strings.HasPrefix(field(l, "peer"), ip+":") || !strings.HasPrefix(field(l, "local"), ip+":") {
			t.Errorf("want TCP addresses kept: %s", l)
		}
		if field(l, "tcpi_state") != "1" || field(l, "info") != "0" || field(l, "cc") != "extds" ||
			field(l, "domain") != "inet" || field(l, "nodelay") != "1" {
			t.Errorf("want emulated TCP state: %s", l)
		}
	}
	if got := f.bytes.Load(); got < 2*3*size {
		t.Errorf("fake spliced %d bytes, want at least %d", got, 2*3*size)
	}
	if c, a := f.count("shim-connect"), f.count("shim-accept"); c != 3 || a != 3 {
		t.Errorf("connect %d accept %d, want 3 each: %s", c, a, f.opList())
	}
	// Every process that closes its last copy of the listener says so
	// (forked children too): exnd drops the registration only once the
	// socket itself is gone.
	if l, u := f.count("shim-listen"), f.count("shim-unlisten"); l != 1 || u < 1 {
		t.Errorf("listen %d unlisten %d, want 1 and at least 1: %s", l, u, f.opList())
	}
}

// TestThreads: 16 clients connect and switch at once from one process
// (the fd table and its lock under contention).
func TestThreads(t *testing.T) {
	lib, prog := build(t)
	ip := localIP(t)
	f := newFake(t, "extds")
	e := env(lib, f.path)
	const n = 16
	p := strconv.Itoa(port())
	srv := start(t, e, prog, "server", ip, p, strconv.Itoa(n), "fork")
	srv.waitOutput(t, "listening", 10*time.Second)
	out, err := run(t, e, 60*time.Second, prog, "par", strconv.Itoa(n), ip, p, strconv.Itoa(1<<20))
	if err != nil {
		t.Fatalf("par: %v\n%s\nserver:\n%s", err, out, srv.out.String())
	}
	if got := strings.Count(out, "ok ") - strings.Count(out, "kernel=inet"); got != n {
		t.Errorf("%d of %d clients switched:\n%s", got, n, out)
	}
	if err := srv.wait(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestExndSaysTCP(t *testing.T) {
	lib, _ := build(t)
	ip := localIP(t)
	f := newFake(t, "tcp")
	e := env(lib, f.path)
	for _, l := range transfer(t, e, e, ip, false, 1<<20, "", "nb") {
		if field(l, "kernel") != "inet" || field(l, "server-kernel") != "inet" {
			t.Errorf("want plain TCP: %s", l)
		}
	}
	if f.count("shim-connect") != 2 || f.count("shim-accept") != 2 {
		t.Errorf("want the shim to ask: %s", f.opList())
	}
}

// TestMixed: one end shimmed, the other not, either way round.
func TestMixed(t *testing.T) {
	lib, _ := build(t)
	ip := localIP(t)
	f := newFake(t, "extds")
	shimmed, plain := env(lib, f.path), os.Environ()
	for _, l := range transfer(t, shimmed, plain, ip, false, 1<<20, "", "nb") {
		if field(l, "kernel") != "inet" || field(l, "server-kernel") != "unix" {
			t.Errorf("want only the server switched: %s", l)
		}
	}
	for _, l := range transfer(t, plain, shimmed, ip, false, 1<<20, "", "nb") {
		if field(l, "kernel") != "unix" || field(l, "server-kernel") != "inet" {
			t.Errorf("want only the client switched: %s", l)
		}
	}
}

func TestForce(t *testing.T) {
	lib, prog := build(t)
	ip := localIP(t)
	for _, mode := range []string{"tcp", "error"} {
		f := newFake(t, mode)
		p := strconv.Itoa(port())
		srv := start(t, os.Environ(), prog, "server", ip, p, "1")
		srv.waitOutput(t, "listening", 10*time.Second)
		out, err := run(t, env(lib, f.path, "EXTDS_MODE=force"), 10*time.Second, prog, "client", ip, p, "1000")
		if err == nil || !strings.Contains(out, "Connection refused") {
			t.Errorf("exnd %s, force: want the connect refused, got %v: %s", mode, err, out)
		}
		srv.cmd.Process.Kill()
	}
	out, err := run(t, env(lib, filepath.Join(t.TempDir(), "none.sock"), "EXTDS_MODE=force"), 10*time.Second,
		prog, "client", ip, strconv.Itoa(port()), "1000")
	if err == nil || !strings.Contains(out, "refused") {
		t.Errorf("no exnd, force: want refused, got %v: %s", err, out)
	}
}

// TestIperf3 and TestSockperf run the unmodified tools through the shim
// against the fake: every mechanism they touch (select, non-blocking
// connect, TCP_INFO, TCP_CONGESTION, poll, epoll) on switched sockets.
func TestIperf3(t *testing.T) {
	lib, _ := build(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("needs iperf3")
	}
	ip := localIP(t)
	for _, extra := range [][]string{nil, {"-P", "4"}, {"-R"}} {
		t.Run(strings.Join(append([]string{"iperf3"}, extra...), ""), func(t *testing.T) {
			f := newFake(t, "extds")
			e := env(lib, f.path)
			p := strconv.Itoa(port())
			srv := start(t, e, "iperf3", "-s", "-1", "-B", ip, "-p", p)
			time.Sleep(300 * time.Millisecond)
			args := append([]string{"iperf3", "-c", ip, "-p", p, "-t", "1"}, extra...)
			out, err := run(t, e, 30*time.Second, args...)
			if err != nil {
				t.Fatalf("iperf3: %v\n%s\nserver:\n%s", err, out, srv.out.String())
			}
			if err := srv.wait(t, 10*time.Second); err != nil {
				t.Fatalf("server: %v", err)
			}
			streams := 1
			if len(extra) == 2 {
				streams = 4
			}
			if c := f.count("shim-connect"); c != streams+1 {
				t.Errorf("%d connects switched, want %d (control + streams): %s", c, streams+1, f.opList())
			}
			if f.bytes.Load() < 1<<20 {
				t.Errorf("only %d bytes through the fake", f.bytes.Load())
			}
		})
	}
}

func TestSockperf(t *testing.T) {
	lib, _ := build(t)
	if _, err := exec.LookPath("sockperf"); err != nil {
		t.Skip("needs sockperf")
	}
	ip := localIP(t)
	for _, mux := range []string{"s", "p", "e"} {
		for _, test := range []string{"ping-pong", "throughput"} {
			t.Run(test+"-"+mux, func(t *testing.T) {
				f := newFake(t, "extds")
				e := env(lib, f.path)
				// -F needs a feed file of "T:IP:PORT" lines.
				feed := filepath.Join(t.TempDir(), "feed")
				if err := os.WriteFile(feed, []byte(fmt.Sprintf("T:%s:%d\n", ip, port())), 0o644); err != nil {
					t.Fatal(err)
				}
				start(t, e, "sockperf", "server", "-f", feed, "-F", mux)
				time.Sleep(300 * time.Millisecond)
				out, err := run(t, e, 30*time.Second, "sockperf", test, "-f", feed, "-F", mux, "-t", "1")
				if err != nil || !strings.Contains(out, "Summary") {
					t.Fatalf("sockperf: %v\n%s", err, out)
				}
				if f.count("shim-connect") < 1 || f.count("shim-accept") < 1 || f.bytes.Load() == 0 {
					t.Errorf("not switched: %d bytes: %s", f.bytes.Load(), f.opList())
				}
			})
		}
	}
}
