package shimsrv

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/extds/rdirect"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// directApp is what a program under the shim holds for a direct
// connection: V (its descriptor), the attached buffer with its bell, and
// a dup of the bell (for shim-relay). A goroutine plays the shim's park
// on V (watchV).
type directApp struct {
	v       *net.UnixConn
	ep      *dring.Endpoint
	bell    *os.File
	res     SwitchResult
	vw      *os.File // watchV's dup of V
	relayed atomic.Bool
	watched chan struct{}
}

func (d *directApp) Close() {
	d.ep.Close()
	d.v.Close()
	d.vw.Close()
	<-d.watched
	d.bell.Close()
}

// watchV plays the shim's park on V (docs/direct.md, "exnd waking its
// own program"): V readable with end of file, or hung up, while the side
// is not relayed, is exnd's own reset (or its death), and the program's
// calls fail with ECONNRESET. The Endpoint parks on its bell alone, so
// the test's stand-in wakes it with Reset. It reads nothing (a peek),
// and stops at the first byte (the side is relayed: V is a plain
// socket).
func (d *directApp) watchV() {
	defer close(d.watched)
	rc, err := d.vw.SyscallConn()
	if err != nil {
		return
	}
	var end bool
	buf := make([]byte, 1)
	if err := rc.Read(func(fd uintptr) bool {
		n, err := sys.RecvPeek(int(fd), buf)
		if sys.IsEAGAIN(err) {
			return false
		}
		end = err != nil || n == 0
		return true
	}); err == nil && end && !d.relayed.Load() {
		d.ep.Reset()
	}
}

// newDirectNodes starts two nodes whose shim servers make direct
// connections in one directory, as two exnds on one shm fabric.
func newDirectNodes(t *testing.T) (a, b *node, dir string) {
	return newDirectNodesWith(t, "one host", nil)
}

// newDirectNodesWith starts two nodes that make direct connections on
// one host (in the directory it returns) or across hosts (each with its
// engine), with tweak's changes to their DirectConfig.
func newDirectNodesWith(t *testing.T, mode string, tweak func(*DirectConfig)) (a, b *node, dir string) {
	t.Helper()
	dir = t.TempDir()
	cfg := func(id fabric.NodeID, eng *rdirect.Engine, dir string) Option {
		c := DirectConfig{Fabric: "t", Dir: dir, Node: id, Ring: dring.MinRing * 4, Engine: eng}
		if tweak != nil {
			tweak(&c)
		}
		return WithDirect(c)
	}
	if mode == "one host" {
		a, b = newNodesPer(t, func(id fabric.NodeID) []Option { return []Option{cfg(id, nil, dir)} })
		return a, b, dir
	}
	a, b = newNodesWrapped(t, func(id fabric.NodeID, nic fabric.NIC) (extds.Attachment, []Option) {
		ep, err := nic.Open(rdirect.VPID)
		if err != nil {
			t.Fatal(err)
		}
		eng, err := rdirect.New(ep, rdirect.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { eng.Close() }) // after the server's (cleanups run last first)
		return nic, []Option{cfg(id, eng, t.TempDir())}
	})
	return a, b, dir
}

// callDirect hands tc over with "direct" and returns the three
// descriptors of the answer (docs/direct.md, "What the program gets"):
// V, the buffer, the side's bell.
func (n *node) callDirect(t *testing.T, op string, tc *net.TCPConn) (SwitchResult, []*os.File) {
	t.Helper()
	f, err := tc.File()
	if err != nil {
		t.Fatal(err)
	}
	var res SwitchResult
	out, err := n.cl.CallFDs(t.Context(), &res, []*os.File{f}, op, "direct")
	f.Close()
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	if res.Mode != "direct" || res.Side == nil || len(out) != 3 || res.Ring != dring.MinRing*4 {
		for _, f := range out {
			f.Close()
		}
		t.Fatalf("%s: answer %+v with %d descriptors, want direct and 3", op, res, len(out))
	}
	tc.Close() // the shim's dup3 of V over it
	return res, out
}

// switchDirect hands tc over with "direct" and attaches what comes back
// as the shim does.
func (n *node) switchDirect(t *testing.T, op string, tc *net.TCPConn) *directApp {
	t.Helper()
	res, out := n.callDirect(t, op, tc)
	si := *res.Side
	bell, err := dupFile(out[2])
	if err != nil {
		t.Fatal(err)
	}
	fs := &dring.Files{Buf: out[1]}
	fs.Bell[si] = out[2]
	ep, err := dring.Attach(fs, si)
	if err != nil {
		out[0].Close()
		bell.Close()
		t.Fatal(err)
	}
	vc, err := net.FileConn(out[0]) // makes V non-blocking: vw is pollable
	if err == nil {
		var vw *os.File
		if vw, err = dupFile(out[0]); err == nil {
			out[0].Close()
			d := &directApp{v: vc.(*net.UnixConn), ep: ep, bell: bell, res: res, vw: vw, watched: make(chan struct{})}
			go d.watchV()
			return d
		}
		vc.Close()
	}
	out[0].Close()
	ep.Close()
	bell.Close()
	t.Fatal(err)
	return nil
}

func directPair(t *testing.T) (a, b *node, dir string, client, server *directApp) {
	t.Helper()
	a, b, dir = newDirectNodes(t)
	client, server = connectDirect(t, a, b, nil)
	return a, b, dir, client, server
}

// connectDirect makes one direct connection from a to a listener on b
// and closes both ends at the end of the test. seen, if not nil, gets
// each TCP socket before it is handed over (the accepted one on the
// accepting goroutine).
func connectDirect(t *testing.T, a, b *node, seen func(*net.TCPConn)) (client, server *directApp) {
	t.Helper()
	ln := testenv.ListenTCP(t)
	b.listen(t, ln)
	ch := acceptOne(ln, func(c *net.TCPConn) (*directApp, error) {
		if seen != nil {
			seen(c)
		}
		return b.switchDirect(t, "shim-accept", c), nil
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if seen != nil {
		seen(c.(*net.TCPConn))
	}
	client = a.switchDirect(t, "shim-connect", c.(*net.TCPConn))
	r := <-ch
	if r.err != nil {
		client.Close()
		t.Fatalf("accept: %v", r.err)
	}
	server = r.v
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// exchangeBoth sends data from each end to the other at once, through
// the endpoints, and checks what arrives.
func exchangeBoth(t *testing.T, client, server *directApp, data []byte) {
	t.Helper()
	errc := make(chan error, 2)
	go send(client.ep, data, errc)
	go send(server.ep, data, errc)
	for _, r := range []io.Reader{server.ep, client.ep} {
		if got, want := recvSum(t, r, len(data)), recvSum(t, bytes.NewReader(data), len(data)); got != want {
			t.Fatal("stream differs")
		}
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func TestDirectBothWays(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b, dir, client, server := directPair(t)
	if *client.res.Side != 0 || *server.res.Side != 1 {
		t.Fatalf("sides %d/%d, want 0/1", *client.res.Side, *server.res.Side)
	}
	// The connection's names are gone; what is left is the accepting
	// side's pool of ready buffers (dpool.go: a buffer and its bell's
	// listener each), removed when it closes.
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) > 2*poolSize {
		t.Errorf("files left after the handshake: %v", left)
	}
	defer func() {
		b.srv.Close()
		if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
			t.Errorf("files left after exnd closed: %v", left)
		}
	}()
	const n = 300_000
	exchangeBoth(t, client, server, randBytes(n, 7))
	if cs := a.srv.Conns(); len(cs) != 1 || cs[0].Mode != "direct" || cs[0].BytesIn != n || cs[0].BytesOut != n {
		t.Errorf("conns %+v", cs)
	}
	for _, nd := range []*node{a, b} {
		st := nd.srv.Stats()
		if st.DirectConns != 1 || st.DirectActive != 1 || st.Switched != 1 || st.DirectBytesIn != n || st.DirectBytesOut != n || st.BytesIn != n {
			t.Errorf("stats %+v", st)
		}
	}
}

// The program's last close of V is TCP's last close: exnd stores fin and
// rd_closed, so the peer reads EOF and its writes fail.
func TestDirectLastClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, _, _, client, server := directPair(t)
	if _, err := client.ep.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	client.Close()
	got, err := io.ReadAll(server.ep)
	if err != nil || string(got) != "bye" {
		t.Fatalf("read %q, %v; want bye, EOF", got, err)
	}
	if _, err := server.ep.Write([]byte("x")); !errors.Is(err, dring.ErrPeerClosed) {
		t.Fatalf("write after the peer's close: %v", err)
	}
	testenv.Eventually(t, "the connection to end in exnd", 5*time.Second, func() bool { return a.srv.Stats().DirectActive == 0 })
}

// relayV sends shim-relay with side's V and bell on a's control socket,
// as the shim does before exec (withBell false: V alone, as an older
// shim did).
// pingRelayed runs n ping-pongs from client, relayed (its V is a plain
// socket to exnd), to server's endpoint.
func pingRelayed(t testing.TB, client, server *directApp, n int) {
	t.Helper()
	for range n {
		if _, err := client.v.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(server.ep, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("server read %q, %v", buf, err)
		}
		if _, err := server.ep.Write([]byte("pong")); err != nil {
			t.Fatal(err)
		}
		client.v.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(client.v, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("client read %q, %v", buf, err)
		}
	}
}

func relayV(t testing.TB, a *node, side *directApp, withBell bool) {
	t.Helper()
	f, err := side.v.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fds := []*os.File{f}
	if withBell {
		fds = append(fds, side.bell)
	}
	side.relayed.Store(true)
	if _, err := a.cl.CallFDs(t.Context(), nil, fds, "shim-relay"); err != nil {
		t.Fatal(err)
	}
}

// shim-relay (before exec): the client side's V becomes a plain socket
// that exnd relays; the server side stays direct. The shim sends V and
// the side's bell; V alone (an older shim) is relayed too, and a second
// descriptor that is not the connection's bell is refused.
func TestDirectRelay(t *testing.T) {
	for _, withBell := range []bool{true, false} {
		t.Run(map[bool]string{true: "V and bell", false: "V alone"}[withBell], func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			a, _, _, client, server := directPair(t)
			if err := a.cl.Call(t.Context(), nil, "shim-relay"); err == nil {
				t.Fatal("shim-relay without a descriptor accepted")
			}
			vf, err := client.v.File()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := a.cl.CallFDs(t.Context(), nil, []*os.File{vf, server.bell}, "shim-relay"); err == nil {
				t.Fatal("shim-relay with another connection side's bell accepted")
			}
			vf.Close()
			relayV(t, a, client, withBell)
			pingRelayed(t, client, server, 3)
			if st := a.srv.Stats(); st.DirectRelays != 1 {
				t.Errorf("relays %d, want 1", st.DirectRelays)
			}
		})
	}
}

// exnd stopping resets its direct connections: both programs get an
// error, neither hangs.
func TestDirectResetOnClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, _, _, client, server := directPair(t)
	a.srv.Close()
	for _, d := range []*directApp{client, server} {
		if _, err := d.ep.Read(make([]byte, 1)); !errors.Is(err, dring.ErrReset) {
			t.Fatalf("read after exnd stopped: %v, want ErrReset", err)
		}
	}
}

// A client that asks for direct meets an acceptor that does not (no
// "direct" argument): the server asks for the ordinary hello and both
// ends are relayed EXT-DS connections, the bytes intact.
func TestDirectDeclinedIsRelay(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b, _ := newDirectNodes(t)
	ln := testenv.ListenTCP(t)
	b.listen(t, ln)
	ch := acceptOne(ln, func(c *net.TCPConn) (*app, error) { return b.switchConn(t, "shim-accept", c) })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	var res SwitchResult
	out, err := a.cl.CallFDs(t.Context(), &res, []*os.File{f}, "shim-connect", "direct")
	f.Close()
	if err != nil || res.Mode != "extds" || len(out) != 1 {
		t.Fatalf("shim-connect direct: %+v, %d fds, %v; want the relay", res, len(out), err)
	}
	c.Close()
	cl, err := net.FileConn(out[0])
	out[0].Close()
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	r := <-ch
	srv := r.v
	if r.err != nil || srv.res.Mode != "extds" {
		t.Fatalf("accept: %+v, %v", srv, r.err)
	}
	defer srv.Close()
	if _, err := cl.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if st := a.srv.Stats(); st.DirectConns != 0 || st.Switched != 1 {
		t.Errorf("client stats %+v", st)
	}
}

// The peer's node dies (its exnd and its program with it: nobody there
// stores fin): this side's exnd resets the connection once the fabric
// declares the node down, so the program gets an error, not a hang.
func TestDirectPeerNodeDown(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b, _, client, _ := directPair(t)
	b.nic.Close() // the node's fabric presence goes; its exnd never resets anything
	if _, err := client.ep.Read(make([]byte, 1)); !errors.Is(err, dring.ErrReset) {
		t.Fatalf("read with the peer node down: %v, want ErrReset", err)
	}
	testenv.Eventually(t, "the connection to end in exnd", 5*time.Second, func() bool { return a.srv.Stats().DirectActive == 0 })
}

// After shim-relay (exec), the program's shutdown(SHUT_WR) on V is a
// half-close, not its last close: the peer reads EOF and can still
// answer, and the relayed side reads the answer before its own EOF.
func TestDirectRelayHalfClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, _, _, client, server := directPair(t)
	relayV(t, a, client, true)
	if _, err := client.v.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := client.v.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(server.ep)
	if err != nil || string(got) != "request" {
		t.Fatalf("server read %q, %v; want the request, then EOF", got, err)
	}
	if _, err := server.ep.Write([]byte("answer")); err != nil {
		t.Fatalf("answer after the client's half-close: %v", err)
	}
	server.ep.CloseWrite()
	client.v.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(client.v); err != nil || string(got) != "answer" {
		t.Fatalf("client read %q, %v; want the answer, then EOF", got, err)
	}
}

// directModes are the two kinds of direct connection a test runs: one
// host (the two exnds share the buffer's directory and pair the bells by
// connect and accept) and across hosts (each exnd has its own buffer and
// an rdirect engine, bells from a socketpair).
var directModes = []string{"one host", "across hosts"}

// newDirectNodesMode is newDirectNodes for mode.
func newDirectNodesMode(t *testing.T, mode string) (a, b *node) {
	t.Helper()
	a, b, _ = newDirectNodesWith(t, mode, nil)
	return a, b
}

// poolsFull reports whether the pools of ready buffers of ns that are in
// use are full again (a filler makes the replacement of each one taken,
// in the background; across hosts the connecting exnd takes from its
// own pool too).
func poolsFull(ns ...*node) func() bool {
	return func() bool {
		for _, n := range ns {
			n.srv.mu.Lock()
			started := n.srv.pool.started
			n.srv.mu.Unlock()
			if started && len(n.srv.pool.ready) != poolSize {
				return false
			}
		}
		return true
	}
}

// A direct connection costs each exnd at most two descriptors (issue
// #32): E and one bell (one host: its dup of its program's bell; across
// hosts: the engine's end). Counted over the whole process, which holds
// both exnds and both programs here: each program keeps V and its bell
// (the buffer is closed once mapped, as the shim does), so a connection
// may add at most 2+2 for the programs and 2+2 for the exnds.
func TestDirectDescriptorsPerConn(t *testing.T) {
	for _, mode := range directModes {
		t.Run(mode, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			a, b := newDirectNodesMode(t, mode)
			ln := testenv.ListenTCP(t)
			b.listen(t, ln)
			var held []*os.File
			t.Cleanup(func() {
				for _, f := range held {
					f.Close()
				}
			})
			connect := func() {
				ch := acceptOne(ln, func(c *net.TCPConn) ([]*os.File, error) {
					_, out := b.callDirect(t, "shim-accept", c)
					return out, nil
				})
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				_, out := a.callDirect(t, "shim-connect", c.(*net.TCPConn))
				r := <-ch
				if r.err != nil {
					t.Fatal(r.err)
				}
				for _, o := range [][]*os.File{out, r.v} {
					o[1].Close() // the buffer: mapped and closed by the shim
					held = append(held, o[0], o[2])
				}
			}
			connect() // the pool's filler starts with the first accept
			testenv.Eventually(t, "the pools to fill", 5*time.Second, poolsFull(a, b))
			const n = 20
			before := testenv.CountFDs(t)
			for range n {
				connect()
			}
			testenv.Eventually(t, "the pools to fill again", 5*time.Second, poolsFull(a, b))
			// A control connection or a shadow socket of the last
			// switches may still be closing (seen once in CI under the
			// race detector: 163 for 20): the count settles.
			var after int
			settled := func() bool {
				after = testenv.CountFDs(t)
				return float64(after-before)/n <= 8
			}
			for deadline := time.Now().Add(5 * time.Second); !settled() && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("%d descriptors for %d connections", after-before, n)
			if per := float64(after-before) / n; per > 8 {
				t.Fatalf("%.2f descriptors per direct connection in the process (two exnds and two programs); want at most 8", per)
			}
			for _, nd := range []*node{a, b} {
				if st := nd.srv.Stats(); st.DirectActive != n+1 {
					t.Fatalf("direct connections active %d, want %d", st.DirectActive, n+1)
				}
			}
		})
	}
}

// A direct connection across hosts works as on one host: bytes both ways,
// the relay after exec with the bell shim-relay hands over (exnd holds
// none of the program's side before), and the last close as EOF.
func TestDirectAcrossHosts(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b := newDirectNodesMode(t, "across hosts")
	client, server := connectDirect(t, a, b, nil)
	exchangeBoth(t, client, server, bytes.Repeat([]byte("0123456789"), 10_000))
	relayV(t, a, client, true)
	pingRelayed(t, client, server, 3)
	if _, err := client.v.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	client.Close() // the last close of V
	got, err := io.ReadAll(server.ep)
	if err != nil || string(got) != "bye" {
		t.Fatalf("server read %q, %v; want bye, EOF", got, err)
	}
	if _, err := server.ep.Write([]byte("x")); !errors.Is(err, dring.ErrPeerClosed) {
		// rd_closed travels with the next CDC: the write may still go in
		// before it lands; a second one must fail.
		time.Sleep(50 * time.Millisecond)
		if _, err := server.ep.Write([]byte("x")); !errors.Is(err, dring.ErrPeerClosed) {
			t.Fatalf("write after the peer's close: %v", err)
		}
	}
}
