package nstest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// Prefix starts the name of every namespace and shm fabric the harness
// creates; the test process ID follows it.
const Prefix = "exnt-"

var (
	seq atomic.Uint64 // unique suffixes within this process

	regMu    sync.Mutex
	regNetns = map[string]bool{}
	regPgids = map[int]bool{}
	regShm   = map[string]bool{}
	regDirs  = map[string]bool{}
)

// Main runs the tests of a package that uses the harness. It sweeps stale
// resources first, turns SIGINT/SIGTERM into a tidy-up, and tears down
// whatever is left at the end. Use it from TestMain.
func Main(m *testing.M) {
	sweepStale()
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigc
		fmt.Fprintf(os.Stderr, "nstest: %v: tearing down namespaces, processes and shm files\n", s)
		teardownAll()
		os.Exit(2)
	}()
	code := m.Run()
	teardownAll()
	os.Exit(code)
}

// Unique returns a name "exnt-<pid>-<tag><n>" unique in this process.
func Unique(tag string) string {
	return fmt.Sprintf("%s%d-%s%d", Prefix, os.Getpid(), tag, seq.Add(1))
}

// register adds k to (on) or removes it from one of the registries of
// what the harness must clean up, under regMu.
func register[K comparable](m map[K]bool, k K, on bool) {
	regMu.Lock()
	defer regMu.Unlock()
	if on {
		m[k] = true
	} else {
		delete(m, k)
	}
}

func registerPgid(p int, on bool) { register(regPgids, p, on) }

func teardownAll() {
	regMu.Lock()
	pgids := make([]int, 0, len(regPgids))
	for p := range regPgids {
		pgids = append(pgids, p)
	}
	var nss, shms, dirs []string
	for n := range regNetns {
		nss = append(nss, n)
	}
	for s := range regShm {
		shms = append(shms, s)
	}
	for d := range regDirs {
		dirs = append(dirs, d)
	}
	regMu.Unlock()
	for _, p := range pgids {
		_ = syscall.Kill(-p, syscall.SIGKILL)
	}
	for _, n := range nss {
		deleteNetns(n)
	}
	for _, s := range shms {
		removeShm(s)
	}
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
}

var staleRE = regexp.MustCompile(`^(?:` + Prefix + `|` + ShmPrefix + `)(\d+)[-_]`)

// sweepStale removes namespaces and shm files of earlier test processes
// that are gone (killed before their cleanups ran).
func sweepStale() {
	dead := func(name string) bool {
		m := staleRE.FindStringSubmatch(name)
		if m == nil {
			return false
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() {
			return false
		}
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && dead(f[0]) {
				deleteNetns(f[0])
			}
		}
	}
	if ents, err := os.ReadDir("/dev/shm"); err == nil {
		for _, e := range ents {
			if n, ok := strings.CutPrefix(e.Name(), "exn-"); ok && dead(n) {
				_ = os.Remove(filepath.Join("/dev/shm", e.Name()))
			}
		}
	}
}

// deleteNetns kills every process in namespace n and deletes it.
func deleteNetns(n string) {
	if out, err := exec.Command("ip", "netns", "pids", n).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	for i := 0; i < 20; i++ {
		if exec.Command("ip", "netns", "del", n).Run() == nil {
			break
		}
		if _, err := os.Stat("/run/netns/" + n); errors.Is(err, os.ErrNotExist) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	register(regNetns, n, false)
}

// ShmFiles lists the /dev/shm files of shm fabric name.
func ShmFiles(name string) []string {
	m, _ := filepath.Glob("/dev/shm/exn-" + name + "-*")
	if _, err := os.Stat("/dev/shm/exn-" + name); err == nil {
		m = append(m, "/dev/shm/exn-"+name)
	}
	return m
}

func removeShm(name string) {
	for _, f := range ShmFiles(name) {
		_ = os.Remove(f)
	}
	register(regShm, name, false)
}

// ShmPrefix starts every shm fabric name the harness makes (shm names
// allow no '-'); the test process ID follows it.
const ShmPrefix = "exnt_"

// ShmFabric returns a unique shm fabric name "exnt_<pid>_f<n>" whose
// /dev/shm files are removed on cleanup.
func ShmFabric(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("%s%d_f%d", ShmPrefix, os.Getpid(), seq.Add(1))
	register(regShm, name, true)
	t.Cleanup(func() { removeShm(name) })
	return name
}

// Netns is a network namespace the test created.
type Netns struct {
	Name string
}

// NewNetns creates a namespace with lo up, deleted (with every process
// in it) on cleanup.
func NewNetns(t testing.TB, tag string) *Netns {
	t.Helper()
	n := &Netns{Name: Unique(tag)}
	register(regNetns, n.Name, true)
	if out, err := exec.Command("ip", "netns", "add", n.Name).CombinedOutput(); err != nil {
		register(regNetns, n.Name, false)
		t.Fatalf("ip netns add %s: %v: %s", n.Name, err, out)
	}
	t.Cleanup(func() { deleteNetns(n.Name) })
	n.MustRun(t, 5*time.Second, "ip", "link", "set", "lo", "up")
	return n
}

// command builds "ip netns exec NS args..." in its own process group,
// killed with the group when ctx ends or the test process dies.
func (n *Netns) command(ctx context.Context, env []string, args ...string) *exec.Cmd {
	full := append([]string{"netns", "exec", n.Name}, args...)
	cmd := exec.CommandContext(ctx, "ip", full...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	return cmd
}

// Run runs args inside the namespace, killing it after timeout, and
// returns its combined output.
func (n *Netns) Run(timeout time.Duration, args ...string) (string, error) {
	return n.RunEnv(timeout, nil, args...)
}

// RunEnv is Run with extra environment variables.
func (n *Netns) RunEnv(timeout time.Duration, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := n.command(ctx, env, args...)
	var out testenv.Output
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("%s: start %q: %w", n.Name, args, err)
	}
	registerPgid(cmd.Process.Pid, true)
	err := cmd.Wait()
	registerPgid(cmd.Process.Pid, false)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // stragglers in the group
	if ctx.Err() != nil {
		return out.String(), fmt.Errorf("%s: %q: timed out after %v: %w", n.Name, args, timeout, ctx.Err())
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s: %q: %w", n.Name, args, err)
	}
	return out.String(), nil
}

// MustRun is Run that fails the test on error.
func (n *Netns) MustRun(t testing.TB, timeout time.Duration, args ...string) string {
	t.Helper()
	out, err := n.Run(timeout, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// Proc is a background process inside a namespace.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	out  testenv.Output
	done chan struct{}
	err  error
}

// Start starts args in the background inside the namespace. The process
// group is killed on cleanup if it is still running.
func (n *Netns) Start(t testing.TB, args ...string) *Proc {
	t.Helper()
	return n.StartEnv(t, nil, args...)
}

// StartEnv is Start with extra environment variables.
func (n *Netns) StartEnv(t testing.TB, env []string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: n.Name + ":" + filepath.Base(args[0]), done: make(chan struct{})}
	p.Cmd = n.command(context.Background(), env, args...)
	p.Cmd.Stdout, p.Cmd.Stderr = &p.out, &p.out
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("%s: start %q: %v", n.Name, args, err)
	}
	pgid := p.Cmd.Process.Pid
	registerPgid(pgid, true)
	go func() {
		p.err = p.Cmd.Wait()
		registerPgid(pgid, false)
		close(p.done)
	}()
	t.Cleanup(func() {
		if err := p.Kill(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// Kill kills the process group and waits up to 5 s for the process.
func (p *Proc) Kill() error {
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s: pid %d did not die after SIGKILL", p.Name, p.Pid())
	}
}

// Pid returns the process ID (which is also its process group ID).
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Output returns what the process wrote so far.
func (p *Proc) Output() string { return p.out.String() }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process (not its group).
func (p *Proc) Signal(sig syscall.Signal) error { return syscall.Kill(p.Pid(), sig) }

// Stop sends SIGTERM to the process and waits up to timeout for it to
// exit, as Wait does.
func (p *Proc) Stop(timeout time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("%s: sigterm: %w", p.Name, err)
	}
	return p.Wait(timeout)
}

// Wait waits up to timeout for the process to exit and returns its exit
// error (nil for status 0). On timeout it kills the group and returns an
// error saying so.
func (p *Proc) Wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("%s: still running after %v; killed", p.Name, timeout)
	}
}

// Eventually polls f every 50 ms until it returns nil or timeout passes,
// and returns f's last error.
func Eventually(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// buildOnce returns the path of what b builds: the first call makes a
// temporary directory (Main removes it after the tests) and runs build
// in it.
func buildOnce(t testing.TB, b *testenv.Built, name string, build func(dir string) (string, error)) string {
	t.Helper()
	return b.Path(t, func() (string, error) {
		dir, err := os.MkdirTemp("", Prefix+strconv.Itoa(os.Getpid())+"-"+name)
		if err != nil {
			return "", err
		}
		register(regDirs, dir, true)
		return build(dir)
	})
}

var exndBuilt testenv.Built

// Build builds the module's commands (go build ./cmd/exnd) once per test
// process into a temporary directory removed after the tests, and returns
// the path of exnd.
func Build(t testing.TB) string {
	t.Helper()
	return buildOnce(t, &exndBuilt, "bin", func(dir string) (string, error) {
		// The tests' own build tags (ofi) go to exnd too, so a test
		// binary built with -tags ofi runs an exnd that has the backend.
		args := []string{"build", "-o", dir + "/"}
		if buildTags != "" {
			args = append(args, "-tags", buildTags)
		}
		cmd := exec.Command("go", append(args, "./cmd/exnd")...)
		cmd.Dir = testenv.ModuleRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("go build ./cmd/exnd: %w\n%s", err, out)
		}
		return filepath.Join(dir, "exnd"), nil
	})
}

// execOutput runs a command outside any namespace with a timeout.
func execOutput(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// Veth connects namespaces a and b with a veth pair (the perf baseline),
// addressed 10.78.subnet.1/24 in a and .2 in b. It returns the two
// addresses. The pair goes away with the namespaces.
func Veth(t testing.TB, a, b *Netns, subnet int) (ipA, ipB string) {
	t.Helper()
	ipA, ipB = fmt.Sprintf("10.78.%d.1", subnet), fmt.Sprintf("10.78.%d.2", subnet)
	va, vb := fmt.Sprintf("veth%da", seq.Add(1)), fmt.Sprintf("veth%db", seq.Add(1))
	for _, args := range [][]string{
		{"link", "add", va, "netns", a.Name, "type", "veth", "peer", "name", vb, "netns", b.Name},
		{"-n", a.Name, "addr", "add", ipA + "/24", "dev", va},
		{"-n", b.Name, "addr", "add", ipB + "/24", "dev", vb},
		{"-n", a.Name, "link", "set", va, "up"},
		{"-n", b.Name, "link", "set", vb, "up"},
	} {
		if out, err := runIP(args...); err != nil {
			t.Fatalf("ip %q: %v: %s", args, err, out)
		}
	}
	return ipA, ipB
}
