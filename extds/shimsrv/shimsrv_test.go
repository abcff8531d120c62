package shimsrv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/testenv"
)

// node is one fabric node with an extds Device, a shim server and a
// control socket, as exnd runs them.
type node struct {
	nic  fabric.NIC
	dev  *extds.Device
	srv  *Server
	cs   *control.Server
	path string
	cl   *control.Client
}

var loopback = netip.MustParseAddr("127.0.0.1")

// newNodes starts two nodes on one mem cluster. Both resolve 127.0.0.1
// to the other node, so loopback TCP sockets look like fabric peers.
func newNodes(t *testing.T, opts ...Option) (a, b *node) {
	t.Helper()
	return newNodesPer(t, func(fabric.NodeID) []Option { return opts })
}

// newNodesPer is newNodes with options per node ID.
func newNodesPer(t *testing.T, optsFor func(id fabric.NodeID) []Option) (a, b *node) {
	t.Helper()
	return newNodesWrapped(t, func(id fabric.NodeID, nic fabric.NIC) (extds.Attachment, []Option) { return nic, optsFor(id) })
}

// newNodesWrapped is newNodesPer whose Devices attach through what
// attach makes of each node's NIC.
func newNodesWrapped(t *testing.T, attach func(id fabric.NodeID, nic fabric.NIC) (extds.Attachment, []Option)) (a, b *node) {
	t.Helper()
	cl := mem.NewCluster()
	mk := func(id, peer fabric.NodeID) *node {
		n := &node{}
		var err error
		if n.nic, err = cl.NewNIC(id); err != nil {
			t.Fatal(err)
		}
		att, opts := attach(id, n.nic)
		if n.dev, err = extds.NewDevice(att, extds.WithResolver(extds.StaticResolver{loopback: peer}),
			extds.WithHandshakeTimeout(500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		n.srv = New(n.dev, nil, nil, opts...)
		n.cs = control.NewServer(nil)
		n.srv.Register(n.cs)
		n.path = filepath.Join(t.TempDir(), fmt.Sprintf("n%d.sock", id))
		if err := n.cs.Listen(n.path); err != nil {
			t.Fatal(err)
		}
		if n.cl, err = control.Dial(t.Context(), n.path); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			n.cl.Close()
			n.cs.Close()
			n.srv.Close()
			n.dev.Close()
			n.nic.Close()
		})
		return n
	}
	return mk(1, 2), mk(2, 1)
}

var pid = strconv.Itoa(os.Getpid())

func (n *node) call(t *testing.T, files []*os.File, op string, args ...string) (SwitchResult, *os.File, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var r SwitchResult
	f, err := n.cl.CallFD(ctx, &r, files, op, args...)
	return r, f, err
}

func (n *node) listen(t *testing.T, ln net.Listener) {
	t.Helper()
	if err := n.tryListen(t, ln); err != nil {
		t.Fatal(err)
	}
}

// tryListen registers ln as the shim does: shim-listen with the
// listening socket.
func (n *node) tryListen(t *testing.T, ln net.Listener) error {
	t.Helper()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, _, err = n.call(t, []*os.File{f}, "shim-listen")
	return err
}

// app is what the application holds after the shim call: the spliced
// unix socket (extds) or its own TCP socket (tcp).
type app struct {
	net.Conn
	res SwitchResult
}

// switchConn hands tc to the shim server as the shim does. On "extds" the
// application's TCP descriptor is replaced by the returned socketpair end
// (the shim's dup3): here the TCP conn is closed and the unix end used.
func (n *node) switchConn(t *testing.T, op string, tc *net.TCPConn) (*app, error) {
	f, err := tc.File()
	if err != nil {
		t.Fatal(err)
	}
	res, out, err := n.call(t, []*os.File{f}, op)
	f.Close()
	if err != nil {
		return nil, err
	}
	if res.Mode == "tcp" {
		if out != nil {
			out.Close()
			t.Errorf("%s: tcp answer came with a descriptor", op)
		}
		return &app{Conn: tc, res: res}, nil
	}
	if res.Mode != "extds" || out == nil || res.ID == 0 {
		t.Fatalf("%s: answer %+v, fd %v", op, res, out != nil)
	}
	uc, err := net.FileConn(out)
	out.Close()
	if err != nil {
		t.Fatal(err)
	}
	tc.Close()
	return &app{Conn: uc, res: res}, nil
}

// pairUp connects a client app on a to a server app on b through ln,
// both switched by their shim servers.
func pairUp(t *testing.T, a, b *node, ln net.Listener) (client, server *app) {
	t.Helper()
	ch := acceptOne(ln, func(c *net.TCPConn) (*app, error) { return b.switchConn(t, "shim-accept", c) })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client, err = a.switchConn(t, "shim-connect", c.(*net.TCPConn))
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		client.Close()
		t.Fatal(r.err)
	}
	return client, r.v
}

// accepted is what acceptOne's goroutine yields.
type accepted[T any] struct {
	v   T
	err error
}

// acceptOne accepts one connection on ln in a goroutine and hands it to
// serve (a shim server's switch, as the server application's side). The
// channel yields serve's result, or the error of the accept or of serve
// (the connection then closed).
func acceptOne[T any](ln net.Listener, serve func(*net.TCPConn) (T, error)) <-chan accepted[T] {
	ch := make(chan accepted[T], 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- accepted[T]{err: err}
			return
		}
		v, err := serve(c.(*net.TCPConn))
		if err != nil {
			c.Close()
		}
		ch <- accepted[T]{v, err}
	}()
	return ch
}

// switchedPair makes two nodes, a listener on b served by b's shim server
// and one connection through it, both apps closed (server first) at the
// end of the test.
func switchedPair(t *testing.T) (a, b *node, ln net.Listener, client, server *app) {
	t.Helper()
	a, b = newNodes(t)
	ln = testenv.ListenTCP(t)
	b.listen(t, ln)
	client, server = pairUp(t, a, b, ln)
	t.Cleanup(func() { server.Close(); client.Close() })
	return a, b, ln, client, server
}

func randBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, ^seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// send writes data in uneven chunks and reports the error.
func send(w io.Writer, data []byte, errc chan<- error) {
	for off, i := 0, 0; off < len(data); i++ {
		n := min(len(data)-off, []int{1, 100, 4096, 70000, 300000}[i%5])
		if _, err := w.Write(data[off : off+n]); err != nil {
			errc <- err
			return
		}
		off += n
	}
	errc <- nil
}

func recvSum(t *testing.T, r io.Reader, n int) [32]byte {
	t.Helper()
	h := sha256.New()
	if got, err := io.CopyN(h, r, int64(n)); err != nil {
		t.Fatalf("read %d of %d bytes: %v", got, n, err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

func TestSwitchedBothWays(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	a, b, _, client, server := switchedPair(t)

	size := 6 << 20
	if testenv.Small() {
		size = 512 << 10
	}
	up, down := randBytes(size, 1), randBytes(size+12345, 2)
	errc := make(chan error, 2)
	go send(client, up, errc)
	go send(server, down, errc)
	var gotUp, gotDown [32]byte
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); gotUp = recvSum(t, server, len(up)) }()
	gotDown = recvSum(t, client, len(down))
	wg.Wait()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if gotUp != sha256.Sum256(up) || gotDown != sha256.Sum256(down) {
		t.Fatal("sha256 mismatch")
	}

	// Conns lists both ends with their byte counts.
	for _, tc := range []struct {
		n       *node
		id      uint64
		side    string
		in, out int
	}{{a, client.res.ID, "connect", len(down), len(up)}, {b, server.res.ID, "accept", len(up), len(down)}} {
		// Counters move just after each write to the application
		// returns, so the last may trail the application's read a little.
		var ci ConnInfo
		testenv.Eventually(t, tc.side+" byte counts", 5*time.Second, func() bool {
			cs := tc.n.srv.Conns()
			if len(cs) != 1 {
				t.Fatalf("%s: %d conns", tc.side, len(cs))
			}
			ci = cs[0]
			return ci.BytesIn == uint64(tc.in) && ci.BytesOut == uint64(tc.out)
		})
		if ci.ID != tc.id || ci.Side != tc.side || ci.Mode != "extds" || ci.PID != os.Getpid() ||
			ci.BytesIn != uint64(tc.in) || ci.BytesOut != uint64(tc.out) || ci.FabricPeer == "" ||
			!strings.HasPrefix(ci.Remote, "127.0.0.1:") {
			t.Fatalf("%s: conn info %+v", tc.side, ci)
		}
	}

	// Half-close: the client's EOF reaches the server app, which can
	// still answer.
	if err := client.Conn.(*net.UnixConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := server.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("server read after client CloseWrite: %d, %v", n, err)
	}
	if _, err := io.WriteString(server, "bye"); err != nil {
		t.Fatal(err)
	}
	server.Close()
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(client); err != nil || string(got) != "bye" {
		t.Fatalf("client read %q, %v", got, err)
	}
	client.Close()
	testenv.Eventually(t, "connections released", 5*time.Second, func() bool {
		return len(a.srv.Conns()) == 0 && len(b.srv.Conns()) == 0 &&
			a.dev.Stats().Active == 0 && b.dev.Stats().Active == 0
	})
	for _, n := range []*node{a, b} {
		st := n.srv.Stats()
		if st.Switched != 1 || st.Errors != 0 || st.Resets != 0 || len(st.Fallbacks) != 0 || st.Active != 0 {
			t.Fatalf("stats %+v", st)
		}
	}
	if st := a.srv.Stats(); st.BytesOut != uint64(len(up)) || st.BytesIn != uint64(len(down)+3) {
		t.Fatalf("client stats bytes in %d out %d", st.BytesIn, st.BytesOut)
	}
}

// TestPingPongDelivery: small request/response messages reach the
// application straight from the EXT-DS receive loop (Stats.Direct), in
// order and intact, and the splice keeps working when the application
// stops reading for a while (the partial-write hand-off to fabricToApp).
func TestPingPongDelivery(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	a, b, _, client, server := switchedPair(t)
	const rounds = 200
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		for range rounds {
			if _, err := io.ReadFull(server, buf); err != nil {
				errc <- err
				return
			}
			buf[0]++
			if _, err := server.Write(buf); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	msg, got := make([]byte, 64), make([]byte, 64)
	for i := range rounds {
		for j := range msg {
			msg[j] = byte(i + j)
		}
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(client, got); err != nil {
			t.Fatal(err)
		}
		msg[0]++
		if !bytes.Equal(got, msg) {
			t.Fatalf("round %d: got %x want %x", i, got[:8], msg[:8])
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Every message could be written at once: most deliveries are direct.
	for _, n := range []*node{a, b} {
		if d := n.srv.Stats().Direct; d < rounds/2 {
			t.Errorf("%d of %d messages delivered from the receive loop", d, rounds)
		}
	}

	// A stalled application: far more than the socket buffers hold.
	big := randBytes(4<<20, 3)
	go send(server, big, errc)
	time.Sleep(200 * time.Millisecond)
	if sum := recvSum(t, client, len(big)); sum != sha256.Sum256(big) {
		t.Fatal("sha256 mismatch after a stall")
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestResetPropagates: a switched connection that breaks on the far side
// fails the near application's socket.
func TestResetPropagates(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	tests := []struct {
		name    string
		breakIt func(b *node, server *app)
	}{
		// The server application closes without reading what arrived:
		// as with TCP, the peer is reset.
		{"server-closes-unread", func(b *node, server *app) { server.Close() }},
		// The server node goes away entirely.
		{"peer-node-dies", func(b *node, server *app) { b.srv.Close(); b.dev.Close(); b.nic.Close(); server.Close() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b, _, client, server := switchedPair(t)
			if _, err := client.Write([]byte("unread by the server")); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "data at the server app", 5*time.Second, func() bool { return b.srv.Stats().BytesIn > 0 })
			tc.breakIt(b, server)
			// A writer sees the failure (ECONNRESET while its data is
			// queued at exnd's end, EPIPE after).
			chunk := make([]byte, 64<<10)
			var err error
			client.SetWriteDeadline(time.Now().Add(5 * time.Second))
			for err == nil {
				_, err = client.Write(chunk)
			}
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Fatalf("client write: %v, want ECONNRESET or EPIPE", err)
			}
			testenv.Eventually(t, "client conn released", 5*time.Second, func() bool { return len(a.srv.Conns()) == 0 })
			if a.srv.Stats().Resets != 1 {
				t.Fatalf("client resets %d", a.srv.Stats().Resets)
			}
		})
	}
}

// TestConnectNoListener: a shimmed client of a plain server keeps its own
// socket; the server receives nothing but the application's bytes, and
// the socket's blocking mode is as the application left it.
func TestConnectNoListener(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	a, _ := newNodes(t)
	ln := testenv.ListenTCP(t)
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	tc := c.(*net.TCPConn)
	// Make the shared description blocking, as a C application's socket
	// is, and check that exnd's net.FileConn did not leave it changed.
	rc, _ := tc.SyscallConn()
	setNB := func(on bool) {
		rc.Control(func(fd uintptr) {
			if err := sys.SetNonblocking(int(fd), on); err != nil {
				t.Error(err)
			}
		})
	}
	nb := func() (v bool) {
		rc.Control(func(fd uintptr) { v, _ = sys.Nonblocking(int(fd)) })
		return v
	}
	setNB(false)
	ap, err := a.switchConn(t, "shim-connect", tc)
	if err != nil {
		t.Fatal(err)
	}
	if ap.res.Mode != "tcp" || ap.res.Reason != "no_listener" {
		t.Fatalf("answer %+v", ap.res)
	}
	if nb() {
		t.Fatal("the application's socket was left non-blocking")
	}
	setNB(true)
	io.WriteString(ap, "only the app's bytes")
	ap.Close()
	if s := <-got; s != "only the app's bytes" {
		t.Fatalf("plain server received %q", s)
	}
	if st := a.srv.Stats(); st.Fallbacks["no_listener"] != 1 || st.Switched != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestAcceptPlainClient: a shimmed server accepting a plain client keeps
// its socket with every byte the client sent still to be read.
func TestAcceptPlainClient(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	const peekTO = 100 * time.Millisecond
	_, b := newNodes(t, WithPeekTimeout(peekTO))
	ln := testenv.ListenTCP(t)
	b.listen(t, ln)
	tests := []struct {
		name     string
		send     string
		slow     bool // answered only after the peek timeout
		wantRead string
	}{
		{"speaks-first", "GET / HTTP/1.0\r\n\r\n", false, "GET / HTTP/1.0\r\n\r\n"},
		{"one-byte", "X", false, "X"},
		{"magic-prefix-then-silence", "EXD", true, "EXD"},
		{"silent-waits-for-banner", "", true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, tc.send)
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			ap, err := b.switchConn(t, "shim-accept", s.(*net.TCPConn))
			if err != nil {
				s.Close()
				t.Fatal(err)
			}
			defer ap.Close()
			took := time.Since(start)
			if ap.res.Mode != "tcp" || ap.res.Reason != "plain_client" {
				t.Fatalf("answer %+v", ap.res)
			}
			if tc.slow && took < peekTO || !tc.slow && took > peekTO/2 {
				t.Errorf("answer took %v (peek timeout %v)", took, peekTO)
			}
			if tc.wantRead != "" {
				buf := make([]byte, len(tc.wantRead))
				ap.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.ReadFull(ap, buf); err != nil || string(buf) != tc.wantRead {
					t.Fatalf("app read %q, %v", buf, err)
				}
			}
			io.WriteString(ap, "banner")
			buf := make([]byte, 6)
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "banner" {
				t.Fatalf("client read %q, %v", buf, err)
			}
		})
	}
	if n := b.srv.Stats().Fallbacks["plain_client"]; n != uint64(len(tests)) {
		t.Fatalf("plain_client fallbacks %d", n)
	}
}

// TestBadRequests: malformed operations are errors; the server lives on.
func TestBadRequests(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	a, _ := newNodes(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	us1, us2, err := sys.Socketpair("t")
	if err != nil {
		t.Fatal(err)
	}
	defer us1.Close()
	defer us2.Close()
	ln := testenv.ListenTCP(t)
	tcpListenerFile, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer tcpListenerFile.Close()
	tests := []struct {
		op      string
		args    []string
		files   []*os.File
		wantErr string
	}{
		{"shim-hello", nil, nil, "want VERSION"},
		{"shim-hello", []string{"1"}, nil, "not supported"},
		{"shim-hello", []string{"one"}, nil, "not supported"},
		{"shim-listen", nil, nil, "listening socket"},
		{"shim-listen", []string{"80", pid}, []*os.File{tcpListenerFile}, "no arguments"},
		{"shim-listen", nil, []*os.File{us1}, "not a TCP socket"},
		{"shim-listen", nil, []*os.File{pr}, "shim-listen"},
		{"shim-unlisten", nil, nil, "want PORT"},
		{"shim-unlisten", []string{"0"}, nil, "bad port"},
		{"shim-unlisten", []string{"65536"}, nil, "bad port"},
		{"shim-connect", nil, nil, "1 socket descriptor"},
		{"shim-connect", []string{pid}, []*os.File{us1}, "no argument or"},
		{"shim-connect", nil, []*os.File{pr}, "socket"},
		{"shim-connect", nil, []*os.File{us1}, "not a TCP socket"},
		{"shim-connect", nil, []*os.File{us1, us2}, "1 socket descriptor"},
		{"shim-accept", nil, []*os.File{us1}, "not a TCP socket"},
		{"shim-accept", nil, []*os.File{tcpListenerFile}, "accept"}, // a listening socket
		{"shim-nosuch", nil, nil, "unknown operation"},
	}
	for _, tc := range tests {
		_, f, err := a.call(t, tc.files, tc.op, tc.args...)
		if f != nil {
			f.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s %v: err %v, want %q", tc.op, tc.args, err, tc.wantErr)
		}
	}
	var v struct{ Version int }
	if err := a.cl.Call(t.Context(), &v, "shim-hello", strconv.Itoa(Version)); err != nil || v.Version != Version {
		t.Fatalf("shim-hello after bad requests: %+v, %v", v, err)
	}
	// Garbage on a raw connection: one error line per request, no crash.
	raw, err := net.Dial("unix", a.path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	io.WriteString(raw, "shim-listen \x00\xff 1\nshim-connect\n\n")
	raw.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 4096)
	var got string
	for strings.Count(got, "\n") < 3 {
		n, err := raw.Read(buf)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		got += string(buf[:n])
	}
	if strings.Count(got, `"ok":false`) != 3 {
		t.Fatalf("responses %q", got)
	}
	// Counted: the four descriptors that were not connected TCP sockets.
	if st := a.srv.Stats(); st.Errors != 4 {
		t.Fatalf("errors counted: %d, want 4", st.Errors)
	}
}

// deadProcess returns the PID of a process that has exited and been
// reaped.
func deadProcess(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("cannot run true:", err)
	}
	return cmd.Process.Pid
}

func TestListenLifecycle(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	_, b := newNodes(t, WithSweepInterval(20*time.Millisecond))
	ln1, ln2 := testenv.ListenTCP(t), testenv.ListenTCP(t)
	p1, p2 := uint16(ln1.Addr().(*net.TCPAddr).Port), uint16(ln2.Addr().(*net.TCPAddr).Port)
	// A second descriptor of ln1's socket, as a forked worker holds it.
	dup1, err := ln1.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer dup1.Close()
	b.listen(t, ln1)
	b.listen(t, ln1) // idempotent
	b.listen(t, ln2)
	if !b.dev.Listening(p1) || !b.dev.Listening(p2) || b.srv.Stats().Listens != 2 {
		t.Fatalf("after listen: %v %v %d", b.dev.Listening(p1), b.dev.Listening(p2), b.srv.Stats().Listens)
	}
	// The registering process closes ln1, a worker still has it: stays.
	ln1.Close()
	if _, _, err := b.call(t, nil, "shim-unlisten", strconv.Itoa(int(p1))); err != nil {
		t.Fatal(err)
	}
	if !b.dev.Listening(p1) {
		t.Fatal("unlisten dropped a socket another descriptor still holds")
	}
	// The last descriptor goes: unlisten drops it at once.
	dup1.Close()
	if _, _, err := b.call(t, nil, "shim-unlisten", strconv.Itoa(int(p1))); err != nil {
		t.Fatal(err)
	}
	if b.dev.Listening(p1) {
		t.Fatal("unlisten kept a closed socket")
	}
	// Closed without unlisten (a killed process): the sweep drops it.
	ln2.Close()
	testenv.Eventually(t, "closed listener swept", 5*time.Second, func() bool { return !b.dev.Listening(p2) })
	if n := b.srv.Stats().Listens; n != 0 {
		t.Fatalf("listens %d after sweep", n)
	}
}

// TestCloseWithActiveConnections: Close resets switched connections,
// joins everything and refuses new work.
func TestCloseWithActiveConnections(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	a, b, ln, client, server := switchedPair(t)
	if err := b.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if b.dev.Listening(uint16(ln.Addr().(*net.TCPAddr).Port)) {
		t.Fatal("port still registered after Close")
	}
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(server); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("server app read after Close: %v", err)
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(client); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client app read after peer Close: %v", err)
	}
	testenv.Eventually(t, "client side released", 5*time.Second, func() bool { return len(a.srv.Conns()) == 0 })
	err := b.tryListen(t, ln)
	if err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Fatalf("listen after Close: %v", err)
	}
}

// TestSocketBuffers: both ends of a switched connection's socketpair get
// SockBuf (past net.core.wmem_max/rmem_max as root, as far as they allow
// otherwise), so a bulk
// stream is not limited to the kernel's 208 KiB default in flight.
func TestSocketBuffers(t *testing.T) {
	a, b, _, client, server := switchedPair(t)
	limit := func(name string) int {
		raw, err := os.ReadFile("/proc/sys/net/core/" + name)
		if err != nil {
			t.Skipf("cannot read the socket buffer limit: %v", err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// The kernel doubles what is set (bookkeeping overhead) and reports
	// the doubled value.
	want := map[int]int{syscall.SO_SNDBUF: 2 * min(SockBuf, limit("wmem_max")), syscall.SO_RCVBUF: 2 * min(SockBuf, limit("rmem_max"))}
	if os.Geteuid() == 0 {
		// CAP_NET_ADMIN: SO_SNDBUFFORCE/SO_RCVBUFFORCE pass the limits.
		want = map[int]int{syscall.SO_SNDBUF: 2 * SockBuf, syscall.SO_RCVBUF: 2 * SockBuf}
	}
	check := func(who string, c net.Conn) {
		t.Helper()
		rc, err := c.(*net.UnixConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		for opt, w := range want {
			var got int
			var gerr error
			if err := rc.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, opt) }); err != nil {
				t.Fatal(err)
			}
			if gerr != nil || got < w {
				t.Errorf("%s: socket option %d = %d, %v; want at least %d", who, opt, got, gerr, w)
			}
		}
	}
	check("client app end", client.Conn)
	check("server app end", server.Conn)
	for _, n := range []*node{a, b} {
		n.srv.mu.Lock()
		for _, e := range n.srv.conns {
			check("exnd end", e.uc)
		}
		n.srv.mu.Unlock()
	}
}
