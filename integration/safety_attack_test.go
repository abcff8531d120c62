package integration

// The second-uid attack test of issue #18: user A (uid 4242) holds a
// registered listener, switched EXT-DS connections on both nodes and a
// kernel-bypass lease on node 2; user B (uid 4243), on the same node,
// tries to close, take over or ride on A's listener registration, to
// list, detach or re-register A's lease, to see A's connections, to take
// A's descriptors (pidfd_getfd), and to open the fabric's /dev/shm files.
// Attempts that reach exnd are refused and counted in its /metrics
// (scraped over HTTP); attempts the kernel refuses (file modes, ptrace
// rules) never reach exnd and are checked by their errno. exnd stays up
// and A's connection still carries bytes afterwards.
//
// The users are this test binary, copied where both uids can run it and
// re-executed with EXNT_ATTACK set (init below, before TestMain); they
// speak the control protocol as libextds.so does (control.Client), which
// a Go program has to, since Go bypasses LD_PRELOAD.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
	"golang.org/x/sys/unix"
)

const (
	uidA = 4242 // the victim
	uidB = 4243 // the attacker
)

// attackRole runs the re-executed test binary as one role of
// TestSafetyAttack (EXNT_ATTACK); TestMain calls it and exits.
func attackRole(role string) {
	{
		var err error
		switch role {
		case "victim-server":
			err = victimServer()
		case "victim-client":
			err = victimClient()
		case "attacker":
			err = attacker()
		default:
			err = fmt.Errorf("unknown role %q", role)
		}
		if err != nil {
			fmt.Printf("%s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func ctlDial() (*control.Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, os.Getenv("EXNT_CTL"))
	if err != nil {
		return nil, err
	}
	if err := c.Call(ctx, nil, "shim-hello", strconv.Itoa(shimsrv.Version)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

type switchReply struct {
	Mode   string `json:"mode"`
	ID     uint64 `json:"id"`
	Reason string `json:"reason"`
}

// handOver does what the shim does with a connected socket: shim-connect
// or shim-accept it, and return the socketpair end exnd splices, or nil
// for plain TCP.
func handOver(op string, c net.Conn) (*os.File, switchReply, error) {
	var r switchReply
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		return nil, r, err
	}
	defer f.Close()
	cl, err := ctlDial()
	if err != nil {
		return nil, r, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	uf, err := cl.CallFD(ctx, &r, []*os.File{f}, op)
	return uf, r, err
}

// victimServer (user A, node 2): listen on EXNT_ADDR, register the
// listener, lease a VPID block, and echo on every connection, switched
// where exnd agrees.
func victimServer() error {
	ln, err := net.Listen("tcp4", os.Getenv("EXNT_ADDR"))
	if err != nil {
		return err
	}
	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	cl, err := ctlDial()
	if err != nil {
		return err
	}
	ctx := context.Background()
	if f, err := cl.CallFD(ctx, nil, []*os.File{lf}, "shim-listen"); err != nil {
		return err
	} else if f != nil {
		f.Close()
	}
	lf.Close()
	var lease struct {
		Base int `json:"vpid_base"`
	}
	if err := cl.Call(ctx, &lease, "extds-attach", strconv.Itoa(os.Getpid())); err != nil {
		return err
	}
	var lfd int
	rc, _ := ln.(*net.TCPListener).SyscallConn()
	_ = rc.Control(func(fd uintptr) { lfd = int(fd) })
	fmt.Printf("ready pid=%d base=%d lfd=%d\n", os.Getpid(), lease.Base, lfd)
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			uf, r, err := handOver("shim-accept", c)
			if err != nil {
				fmt.Printf("accept: %v\n", err)
				return
			}
			fmt.Printf("accepted mode=%s id=%d\n", r.Mode, r.ID)
			var rw io.ReadWriter = c
			if uf != nil {
				defer uf.Close()
				rw = uf
			}
			_, _ = io.Copy(rw, rw)
		}()
	}
}

// victimClient (user A, node 1): connect, switch, and on SIGUSR1 send a
// line and check its echo.
func victimClient() error {
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	c, err := net.Dial("tcp4", os.Getenv("EXNT_ADDR"))
	if err != nil {
		return err
	}
	uf, r, err := handOver("shim-connect", c)
	if err != nil {
		return err
	}
	if uf == nil {
		return fmt.Errorf("not switched: %+v", r)
	}
	c.Close()
	fmt.Printf("switched id=%d\n", r.ID)
	for range 2 {
		<-usr1
		if err := testenv.Carry(uf, uf, []byte("ping "+strconv.Itoa(os.Getpid())+"\n")); err != nil {
			return fmt.Errorf("echo: %w", err)
		}
		fmt.Println("echo ok")
	}
	return nil
}

// attacker (user B, node 2) tries every way at user A's objects and
// prints one line per attempt: "refused NAME: why" or "ALLOWED NAME".
func attacker() error {
	port := os.Getenv("EXNT_PORT")
	vpid, base, lfd := os.Getenv("EXNT_VPID"), os.Getenv("EXNT_BASE"), os.Getenv("EXNT_LFD")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	allowed := 0
	try := func(name string, err error) {
		if err != nil {
			fmt.Printf("refused %s: %v\n", name, err)
			return
		}
		allowed++
		fmt.Printf("ALLOWED %s\n", name)
	}
	cl, err := ctlDial()
	if err != nil {
		return err
	}
	defer cl.Close()

	// A's listener registration: unregister it, take its descriptor.
	try("shim-unlisten of A's port", cl.Call(ctx, nil, "shim-unlisten", port))
	try("pidfd_getfd of A's listener", func() error {
		pid, _ := strconv.Atoi(vpid)
		fd, _ := strconv.Atoi(lfd)
		pfd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		got, err := unix.PidfdGetfd(pfd, fd, 0)
		if err == nil {
			unix.Close(got)
		}
		return err
	}())
	// Ride on A's registration: B's own socket on A's port number (on
	// another address), accepted and handed to exnd as shim-accept. exnd
	// must not claim it under A's registration.
	try("shim-accept under A's registration", func() error {
		ln, err := net.Listen("tcp4", "127.0.0.1:"+port)
		if err != nil {
			return fmt.Errorf("listen (setup): %w", err)
		}
		defer ln.Close()
		d, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			return fmt.Errorf("dial (setup): %w", err)
		}
		defer d.Close()
		a, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept (setup): %w", err)
		}
		defer a.Close()
		uf, r, err := handOver("shim-accept", a)
		if uf != nil {
			uf.Close()
		}
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		if r.Mode == "tcp" && r.Reason == "not_owner" {
			return errors.New(r.Reason)
		}
		return nil // claimed, or not refused for the right reason
	}())
	// A's lease: every lease operation, under A's PID and under B's own.
	me := strconv.Itoa(os.Getpid())
	try("extds-detach with A's pid", cl.Call(ctx, nil, "extds-detach", vpid, base))
	try("extds-detach of A's lease", cl.Call(ctx, nil, "extds-detach", me, base))
	try("extds-listen on A's lease", cl.Call(ctx, nil, "extds-listen", vpid, base, "4444"))
	try("extds-unlisten on A's lease", cl.Call(ctx, nil, "extds-unlisten", me, base, "4444"))
	var leases struct {
		Leases []struct {
			PID  int `json:"pid"`
			Base int `json:"vpid_base"`
		} `json:"leases"`
	}
	try("extds-leases shows A's lease", func() error {
		if err := cl.Call(ctx, &leases, "extds-leases"); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		for _, l := range leases.Leases {
			if strconv.Itoa(l.Base) == base || strconv.Itoa(l.PID) == vpid {
				return nil
			}
		}
		return errors.New("not listed")
	}())
	// A's switched connections.
	try("conns shows A's connections", func() error {
		var cs []struct {
			UID int `json:"uid"`
		}
		if err := cl.Call(ctx, &cs, "conns"); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		for _, c := range cs {
			if c.UID == uidA {
				return nil
			}
		}
		return errors.New("not listed")
	}())
	// The fabric's memory: every /dev/shm file of it.
	files := strings.Split(os.Getenv("EXNT_SHM"), ":")
	eacces := 0
	for _, f := range files {
		for _, flag := range []int{os.O_RDONLY, os.O_RDWR} {
			fh, err := os.OpenFile(f, flag, 0)
			switch {
			case err == nil:
				fh.Close()
				try("open "+filepath.Base(f), nil)
			case errors.Is(err, syscall.EACCES):
				eacces++
			default:
				fmt.Printf("refused open %s: %v\n", filepath.Base(f), err)
			}
		}
	}
	fmt.Printf("opens refused with EACCES: %d of %d\n", eacces, 2*len(files))
	fmt.Printf("attempts done, %d allowed\n", allowed)
	if allowed > 0 {
		return fmt.Errorf("%d attempts allowed", allowed)
	}
	return nil
}

// TestSafetyAttack runs user B's attempts against user A's objects.
func TestSafetyAttack(t *testing.T) {
	c := startSafety(t, 61, [2]string{"all", "all"})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(filepath.Dir(c.lib), "exnt")
	if out, err := exec.Command("cp", self, bin).CombinedOutput(); err != nil {
		t.Fatalf("copy test binary: %v: %s", err, out)
	}
	as := func(uid int) []string {
		u := strconv.Itoa(uid)
		return []string{"setpriv", "--reuid=" + u, "--regid=" + u, "--clear-groups", bin}
	}
	port := nstest.PortArg()
	addr := c.nodes[1].IP.String() + ":" + port
	srv := c.nodes[1].NS.StartEnv(t, []string{"EXNT_ATTACK=victim-server", "EXNT_CTL=" + c.nodes[1].Control, "EXNT_ADDR=" + addr}, as(uidA)...)
	ready := waitLine(t, srv, "ready ")
	cli := c.nodes[0].NS.StartEnv(t, []string{"EXNT_ATTACK=victim-client", "EXNT_CTL=" + c.nodes[0].Control, "EXNT_ADDR=" + addr}, as(uidA)...)
	waitLine(t, cli, "switched ")
	waitLine(t, srv, "accepted mode=extds")
	ping := func() {
		t.Helper()
		n := strings.Count(cli.Output(), "echo ok")
		if err := cli.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		if err := nstest.Eventually(10*time.Second, func() error {
			if strings.Count(cli.Output(), "echo ok") <= n {
				return fmt.Errorf("no echo yet")
			}
			return nil
		}); err != nil {
			t.Fatalf("A's connection: %v\nclient: %s\nserver: %s", err, cli.Output(), srv.Output())
		}
	}
	ping()

	kv := map[string]string{}
	for _, f := range strings.Fields(ready)[1:] {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	shm := nstest.ShmFiles(c.nodes[1].Fabric)
	if len(shm) < 3 {
		t.Fatalf("fabric files: %v", shm)
	}
	notOwner := func() float64 { return c.metric(t, 1, "exn_shim_refused_total", `reason="not_owner"`) }
	attachRefused := func() float64 { return c.metric(t, 1, "exn_attach_refused_total") }
	n0, a0 := notOwner(), attachRefused()
	listens0 := c.metric(t, 1, "exn_shim_listeners")

	out, err := c.nodes[1].NS.RunEnv(90*time.Second, []string{"EXNT_ATTACK=attacker", "EXNT_CTL=" + c.nodes[1].Control,
		"EXNT_PORT=" + port, "EXNT_VPID=" + kv["pid"], "EXNT_BASE=" + kv["base"], "EXNT_LFD=" + kv["lfd"],
		"EXNT_SHM=" + strings.Join(shm, ":")}, as(uidB)...)
	t.Logf("attacker (uid %d):\n%s", uidB, out)
	if err != nil {
		t.Errorf("attacker: %v", err)
	}
	// Every file open was refused by the kernel with EACCES (0600, root).
	if want := fmt.Sprintf("opens refused with EACCES: %d of %d\n", 2*len(shm), 2*len(shm)); !strings.Contains(out, want) {
		t.Errorf("want %q", want)
	}
	// Counted by exnd: shim-unlisten, shim-accept and the conns listing
	// (not_owner); the four lease operations and the lease listing.
	if d := notOwner() - n0; d < 3 {
		t.Errorf("exn_shim_refused_total{reason=not_owner} grew by %.0f, want >= 3", d)
	}
	if d := attachRefused() - a0; d < 5 {
		t.Errorf("exn_attach_refused_total grew by %.0f, want >= 5", d)
	}
	if l := c.metric(t, 1, "exn_shim_listeners"); l != listens0 {
		t.Errorf("listener registrations %.0f -> %.0f", listens0, l)
	}
	if c.nodes[1].Proc.Exited() {
		t.Fatalf("exnd exited: %s", c.nodes[1].Proc.Output())
	}
	// A still has its connection, registration and lease.
	ping()
	var lr struct {
		Leases []struct {
			PID int `json:"pid"`
		} `json:"leases"`
	}
	if err := c.nodes[1].Call(&lr, "extds-leases"); err != nil || len(lr.Leases) != 1 || strconv.Itoa(lr.Leases[0].PID) != kv["pid"] {
		t.Errorf("A's lease after the attack: %+v, %v", lr, err)
	}
}

// waitLine waits for a line of p's output starting with prefix and
// returns it.
func waitLine(t *testing.T, p *nstest.Proc, prefix string) string {
	t.Helper()
	var line string
	if err := nstest.Eventually(20*time.Second, func() error {
		for _, l := range strings.Split(p.Output(), "\n") {
			if strings.HasPrefix(l, prefix) {
				line = l
				return nil
			}
		}
		if p.Exited() {
			return fmt.Errorf("exited: %v", p.Wait(0))
		}
		return fmt.Errorf("no %q yet", prefix)
	}); err != nil {
		t.Fatalf("%s: %v\n%s", p.Name, err, p.Output())
	}
	return line
}
