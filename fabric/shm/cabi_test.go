package shm

// Cross-language conformance: the C client in cabi/ (shmfab.c and its
// units, the C data plane that libextds.so will link) against this
// package, over the ABI in docs/shm-abi.md. The C endpoint is
// cabi/test/shmfab_peer.c, compiled with gcc with every unit into the
// test's temporary directory and run as a child process (attached to
// node 1 with a lease, the way shm.Attach is); it takes one command per
// line on stdin and answers one line on stdout.
//
// This file holds that harness and the attachment's life (refusals, a
// peer's death, the latency benchmark); cabi_ep_test.go the data path
// between attached endpoints (VELO, RMA, bad input, blocked senders).

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

// cReplyTimeout bounds every answer of the C peer; its own blocking
// commands carry shorter timeouts, so a timeout here is a hang.
const cReplyTimeout = 30 * time.Second

// buildCPeer compiles the C peer into t's temporary directory. It skips
// (fails under EXN_REQUIRE_PRIVILEGED=1, like testenv.RequirePrivileged)
// without gcc.
func buildCPeer(t testing.TB) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		if os.Getenv("EXN_REQUIRE_PRIVILEGED") == "1" {
			t.Fatal("needs gcc on PATH (make deps installs it) and EXN_REQUIRE_PRIVILEGED=1")
		}
		t.Skip("needs gcc on PATH (make deps installs it)")
	}
	units, err := filepath.Glob("cabi/*.c") // every compilation unit of the client
	if err != nil || len(units) == 0 {
		t.Fatalf("no C units in cabi/: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "shmfab_peer")
	args := append([]string{"-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o", bin,
		"cabi/test/shmfab_peer.c"}, units...)
	out, err := exec.Command(gcc, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// cPeer is one running C peer process.
type cPeer struct {
	t   testing.TB
	cmd *exec.Cmd
	in  *os.File
	out *os.File
	r   *bufio.Reader
}

// startCPeer runs bin; the process is killed and reaped when t ends.
func startCPeer(t testing.TB, bin string) *cPeer {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	c := &cPeer{t: t, cmd: cmd, in: inW, out: outR, r: bufio.NewReader(outR)}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		inW.Close()
		outR.Close()
	})
	return c
}

func (c *cPeer) pid() int { return c.cmd.Process.Pid }

// send writes one command without waiting for its answer.
func (c *cPeer) send(format string, args ...any) {
	c.t.Helper()
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		c.t.Fatalf("c peer: write %q: %v", format, err)
	}
}

// reply reads one answer line, bounded by cReplyTimeout.
func (c *cPeer) reply() string {
	c.t.Helper()
	c.out.SetReadDeadline(time.Now().Add(cReplyTimeout))
	line, err := c.r.ReadString('\n')
	if err != nil {
		c.t.Fatalf("c peer: read answer: %v (got %q)", err, line)
	}
	return strings.TrimSpace(line)
}

func (c *cPeer) do(format string, args ...any) string {
	c.t.Helper()
	c.send(format, args...)
	return c.reply()
}

// ok runs a command that must answer "ok".
func (c *cPeer) ok(format string, args ...any) {
	c.t.Helper()
	if r := c.do(format, args...); r != "ok" {
		c.t.Fatalf("c peer: %q: %s", fmt.Sprintf(format, args...), r)
	}
}

// stats parses the C peer's counters.
func (c *cPeer) stats() map[string]uint64 {
	c.t.Helper()
	r := c.do("stats")
	f := strings.Fields(r)
	if len(f) == 0 || f[0] != "stats" {
		c.t.Fatalf("c peer: stats: %s", r)
	}
	m := map[string]uint64{}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		m[k], _ = strconv.ParseUint(v, 10, 64)
	}
	return m
}

func (c *cPeer) recv(v fabric.VPID, timeoutMs int) (from fabric.Addr, tag fabric.Tag, payload []byte) {
	c.t.Helper()
	c.send("recv %d %d", v, timeoutMs)
	return c.recv2()
}

// recv2 reads the answer of a "recv" sent earlier.
func (c *cPeer) recv2() (fabric.Addr, fabric.Tag, []byte) {
	c.t.Helper()
	r := c.reply()
	var node, vpid, tg, mc int
	var h string
	if _, err := fmt.Sscanf(r, "msg %d %d %d %d %s", &node, &vpid, &tg, &mc, &h); err != nil {
		c.t.Fatalf("c peer: recv: %s", r)
	}
	var p []byte
	if h != "-" {
		p, _ = hex.DecodeString(h)
	}
	return fabric.Addr{Node: fabric.NodeID(node), VPID: fabric.VPID(vpid)}, fabric.Tag(tg), p
}

func (c *cPeer) note(v fabric.VPID) fabric.Notification {
	c.t.Helper()
	r := c.do("poll %d 5000", v)
	var k, op, e, node, vpid, l int
	var local uint64
	if _, err := fmt.Sscanf(r, "note %d %d %d %d %d %d %d", &k, &op, &e, &node, &vpid, &l, &local); err != nil {
		c.t.Fatalf("c peer: poll: %s", r)
	}
	return fabric.Notification{Kind: fabric.NotifyKind(k), Op: fabric.Op(op), Err: fabric.NotifyErr(e),
		Peer: fabric.Addr{Node: fabric.NodeID(node), VPID: fabric.VPID(vpid)}, Len: uint32(l), Local: fabric.NLA(local)}
}

func (c *cPeer) region(v fabric.VPID, size int) fabric.NLA {
	c.t.Helper()
	r := c.do("reg %d %d", v, size)
	var nla uint64
	if _, err := fmt.Sscanf(r, "region %d", &nla); err != nil {
		c.t.Fatalf("c peer: reg: %s", r)
	}
	return fabric.NLA(nla)
}

func (c *cPeer) dump(a fabric.NLA, n int) []byte {
	c.t.Helper()
	r := c.do("dump %d %d", a, n)
	h, ok := strings.CutPrefix(r, "hex ")
	b, err := hex.DecodeString(h)
	if !ok || err != nil {
		c.t.Fatalf("c peer: dump: %s", r)
	}
	return b
}

// attachC grants VPIDs base..base+count-1 of owner to c's process and
// attaches it.
func attachC(t testing.TB, c *cPeer, fab string, owner fabric.NIC, base fabric.VPID, count int) Grant {
	t.Helper()
	g, err := lender(t, owner).Grant(base, count, c.pid())
	if err != nil {
		t.Fatal(err)
	}
	c.ok("attach /dev/shm %s %d %d %d %s", fab, owner.Node(), base, count, g.Token)
	return g
}

func seeded(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func pollWant(t testing.TB, ep fabric.Endpoint, want fabric.Notification) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got := pollOne(t, ep, ctx); got != want {
		t.Errorf("go notification %+v, want %+v", got, want)
	}
}

func noteWant(t testing.TB, c *cPeer, v fabric.VPID, want fabric.Notification) {
	t.Helper()
	if got := c.note(v); got != want {
		t.Errorf("c notification %+v, want %+v", got, want)
	}
}

// cabiSetup: owner node 1 (Go, VPID 1), node 2 (Go, VPID 1, long
// backstops so a prompt wake-up was a ring), and the C peer attached to
// node 1 with VPIDs 10 and 11, VPID 10 open.
type cabiSetup struct {
	fab          string
	owner, node2 fabric.NIC
	ep1, ep2     fabric.Endpoint
	c            *cPeer
}

func newCABI(t *testing.T) *cabiSetup {
	testenv.VerifyNoLeaks(t)
	bin := buildCPeer(t)
	s := &cabiSetup{fab: uniqueFabric(t)}
	s.owner = openNIC(t, s.fab, 1)
	s.node2 = openNIC(t, s.fab, 2, withBackstop(longBackstop))
	s.ep1 = fabrictest.OpenEP(t, s.owner, 1)
	s.ep2 = fabrictest.OpenEP(t, s.node2, 1)
	s.c = startCPeer(t, bin)
	attachC(t, s.c, s.fab, s.owner, 10, 2)
	s.c.ok("open 10 0")
	return s
}

// recvCtx receives one message, or returns a zero Message once ctx is
// done (for goroutines, which must not call t.Fatal).
func recvCtx(ctx context.Context, ep fabric.Endpoint) fabric.Message {
	var b [1]fabric.Message
	for {
		if n, err := ep.Recv(b[:]); err != nil || n == 1 {
			return b[0]
		}
		if ep.Wait(ctx) != nil {
			return fabric.Message{}
		}
	}
}

// TestCABIAttachRefusals: a node file of another layout version (-EPROTO
// = 71), a wrong secret, a grant for another PID, VPIDs outside the
// grant: refused, and a correct attach then works.
func TestCABIAttachRefusals(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	bin := buildCPeer(t)
	fab := uniqueFabric(t)
	owner := openNIC(t, fab, 1)
	c := startCPeer(t, bin)
	g, err := lender(t, owner).Grant(10, 2, c.pid())
	if err != nil {
		t.Fatal(err)
	}
	ver := u32(owner.(*nicT).nodeMap.b, nOffVersion)
	ver.Store(layoutVersion - 1)
	if r := c.do("attach /dev/shm %s 1 10 2 %s", fab, g.Token); r != "err -71" {
		t.Errorf("attach to a version %d node: %s, want err -71 (EPROTO)", layoutVersion-1, r)
	}
	ver.Store(layoutVersion)
	bad := g.Token[:len(g.Token)-1] + map[bool]string{true: "1", false: "0"}[strings.HasSuffix(g.Token, "0")]
	if r := c.do("attach /dev/shm %s 1 10 2 %s", fab, bad); r != "err -22" {
		t.Errorf("attach with a wrong secret: %s", r)
	}
	if r := c.do("attach /dev/shm %s 1 10 3 %s", fab, g.Token); r != "err -22" {
		t.Errorf("attach with a wrong count: %s", r)
	}
	other, err := lender(t, owner).Grant(20, 1, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if r := c.do("attach /dev/shm %s 1 20 1 %s", fab, other.Token); r != "err -22" {
		t.Errorf("attach with another process's grant: %s", r)
	}
	c.ok("attach /dev/shm %s 1 10 2 %s", fab, g.Token)
	if r := c.do("open 12 0"); r != "err -22" {
		t.Errorf("open outside the grant: %s", r)
	}
	c.ok("open 11 0")
	c.ok("owner")
	c.ok("exit")
}

// TestCABIPeerDies: (1) the C peer is SIGKILLed while a Go sender is
// blocked on its full mailbox and after it claimed a slot in a Go
// mailbox it never published: the Go sender is released (the owner's
// sweep reclaims the dead holder's lease), the Go consumer skips the
// orphaned slot (counted) and keeps receiving, and the C peer's files
// are gone. (2) a Go node in another process is SIGKILLed while the C
// peer is blocked sending to its full mailbox: C reports -EHOSTDOWN
// (-112) promptly.
func TestCABIPeerDies(t *testing.T) {
	s := newCABI(t)
	c := s.c
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.ok("open 11 2")
	c.region(11, 4096)
	c.ok("forge 2 1 orphan")
	full := fabric.Addr{Node: 1, VPID: 11}
	errc := make(chan error, 1)
	go func() {
		var m fabric.Message
		m.Peer = full
		ms := []fabric.Message{m, m, m, m}
		_, err := s.ep2.Send(ctx, ms)
		errc <- err
	}()
	waitFor(t, "go sender blocked", func() bool { return s.node2.Stats().SendBlocked > 0 })
	c.cmd.Process.Kill()
	start := time.Now()
	if err := <-errc; err == nil || ctx.Err() != nil {
		t.Errorf("blocked send to the killed C peer: %v (ctx %v)", err, ctx.Err())
	}
	t.Logf("go sender released %v after SIGKILL of the C peer", time.Since(start))
	before := s.node2.Stats().Corrupt
	sendOne(t, ctx, s.ep1, s.ep2.Addr(), 3, "behind the orphan")
	if m := recvOne(t, ctx, s.ep2); string(m.Payload()) != "behind the orphan" {
		t.Errorf("go got %q behind the orphaned slot", m.Payload())
	}
	if d := s.node2.Stats().Corrupt - before; d != 1 {
		t.Errorf("go corrupt grew by %d for one orphaned slot, want 1", d)
	}
	if st := lender(t, s.owner).LeaseStats(); st.HolderDied != 1 {
		t.Errorf("lease stats %+v, want one holder died", st)
	}
	waitFor(t, "the C peer's files reclaimed", func() bool {
		for _, f := range fabricFiles(t, s.fab) {
			if strings.Contains(f, "-v1") && !strings.HasSuffix(f, "-v1") && !strings.HasSuffix(f, "-v1.bell") && !strings.HasSuffix(f, "-v1.space") ||
				strings.Contains(f, "-r4") || strings.Contains(f, "-a") {
				return false
			}
		}
		return true
	})

	// (2) on a fabric of its own: node 2 is TestHelperProcess's child.
	fab, owner, ep := nodeOne(t)
	child, _ := startChild(t, ctx, fab, ep)
	c2 := startCPeer(t, buildCPeer(t))
	attachC(t, c2, fab, owner, 10, 1)
	c2.ok("open 10 0")
	c2.ok("send 10 2 1 %d - 5000", tagStall)
	c2.send("flood 10 2 1 1 100 20000")
	waitFor(t, "c sender blocked", func() bool {
		vf := owner.(*nicT)
		p, err := vf.getPeer(2)
		if err != nil {
			return false
		}
		v, err := vf.vpid(p, 1)
		if err != nil {
			return false
		}
		defer v.m.release()
		return v.spaceW.Load() > 0
	})
	child.Process.Kill()
	killed := time.Now()
	r := c2.reply()
	var sent, cerr, ms int
	if _, err := fmt.Sscanf(r, "flood %d %d %d", &sent, &cerr, &ms); err != nil || cerr != -112 {
		t.Fatalf("c flood to a killed peer: %s, want err -112 (EHOSTDOWN)", r)
	}
	t.Logf("c sender saw the SIGKILLed Go node after %v (%d sent)", time.Since(killed), sent)
	if st := c2.stats(); st["peerdown"] == 0 || st["blocked"] == 0 {
		t.Errorf("c stats: %v", st)
	}
	c2.ok("exit")
	// The dead child's files go with the owner's next probe.
	waitFor(t, "the killed node reclaimed", func() bool {
		if owner.Alive(2) == nil {
			return false
		}
		for _, f := range fabricFiles(t, fab) {
			if strings.Contains(f, "-n2") {
				return false
			}
		}
		return true
	})
}

// BenchmarkCABI: 120-byte VELO ping-pong round trips, timed by the C
// peer (p50 and p99 of single round trips, in ns): C → Go echo, and C →
// C echo (two C peers attached to node 1). Compare with
// BenchmarkFabric/VELO/pingpong-120B (Go ↔ Go) in the same run.
func BenchmarkCABI(b *testing.B) {
	bin := buildCPeer(b)
	b.Run("pingpong-120B/C-Go", func(b *testing.B) {
		fab := uniqueFabric(b)
		owner := openNIC(b, fab, 1)
		ep := fabrictest.OpenEP(b, openNIC(b, fab, 2), 1)
		c := startCPeer(b, bin)
		attachC(b, c, fab, owner, 10, 1)
		c.ok("open 10 0")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			out := make([]fabric.Message, 1)
			for {
				m := recvCtx(ctx, ep)
				if ctx.Err() != nil {
					return
				}
				out[0] = m
				if _, err := ep.Send(ctx, out); err != nil {
					return
				}
			}
		}()
		c.ping(b, "ping 10 2 1 %d", b.N)
		cancel()
		<-done
		c.ok("exit")
	})
	b.Run("pingpong-120B/C-C", func(b *testing.B) {
		fab := uniqueFabric(b)
		owner := openNIC(b, fab, 1)
		echo, ping := startCPeer(b, bin), startCPeer(b, bin)
		attachC(b, echo, fab, owner, 10, 1)
		attachC(b, ping, fab, owner, 20, 1)
		echo.ok("open 10 0")
		ping.ok("open 20 0")
		echo.send("echo 10 %d 10000", b.N)
		ping.ping(b, "ping 20 1 10 %d", b.N)
		if r := echo.reply(); r != "ok" {
			b.Fatalf("echo: %s", r)
		}
		echo.ok("exit")
		ping.ok("exit")
	})
}

// ping runs a "ping" command and reports its latencies.
func (c *cPeer) ping(b *testing.B, format string, args ...any) {
	b.Helper()
	b.ResetTimer()
	r := c.do(format, args...)
	b.StopTimer()
	var p50, p99, mean int64
	if _, err := fmt.Sscanf(r, "lat %d %d %d", &p50, &p99, &mean); err != nil {
		b.Fatalf("c ping: %s", r)
	}
	b.ReportMetric(float64(p50), "p50-ns")
	b.ReportMetric(float64(p99), "p99-ns")
}
