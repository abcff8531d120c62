package fabnet

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// target starts one real NIC, node 2, whose peers table also lists node 1
// (a fake peer the test plays over a raw connection) at 127.0.0.1 and
// node 3 at 127.0.0.2 (for the wrong-address check).
func target(t *testing.T, mod func(*Config)) *NIC {
	t.Helper()
	ln := listen(t)
	cfg := Config{
		Node: 2, Listener: ln, Logger: testLogger(),
		Peers: map[fabric.NodeID]string{
			1: "127.0.0.1:1", // never dialled: 1 < 2 dials us
			2: ln.Addr().String(),
			3: "127.0.0.2:1",
			9: "127.0.0.1:1",
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	n, err := open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func rawHello(version uint16, node fabric.NodeID) []byte {
	b := make([]byte, helloSize)
	hello{version: version, node: node, boot: 7}.encode(b)
	return b
}

// expectClosed fails t unless the NIC closes c within a few seconds
// (reads drain whatever it sent first).
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// EOF, or a reset when the NIC closed with our bytes unread.
	if _, err := io.Copy(io.Discard, c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("connection not closed by the NIC: %v", err)
	}
}

func TestHandshakeRejects(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	n := target(t, nil)
	addr := n.Addr().String()
	wrongMagic := rawHello(protoVersion, 1)
	copy(wrongMagic, "HTTP")
	reserved := rawHello(protoVersion, 1)
	reserved[20] = 1
	cases := []struct {
		name string
		send []byte
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"wrong magic", wrongMagic},
		{"wrong version", rawHello(protoVersion+1, 1)},
		{"reserved bits", reserved},
		{"unknown node", rawHello(protoVersion, 77)},
		{"own node id", rawHello(protoVersion, 2)},
		{"wrong address for node", rawHello(protoVersion, 3)},
		{"higher node dials", rawHello(protoVersion, 9)},
		{"short then close", []byte("EXNF")},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(tc.send)
			if tc.name == "short then close" {
				c.(*net.TCPConn).CloseWrite()
			}
			expectClosed(t, c)
			waitUntil(t, "rejection counted", func() bool { return n.NetStats().HandshakeRejected == uint64(i+1) })
		})
	}
	if got := n.Stats().Corrupt; got != uint64(len(cases)) {
		t.Errorf("Stats.Corrupt = %d, want %d", got, len(cases))
	}
	if p := n.Peers(); len(p) != 0 {
		t.Fatalf("a rejected connection became a peer: %v", p)
	}
	// The NIC still works: a legitimate node 1 joins.
	c := fakePeer(t, n, 1)
	c.Close()
}

// fake is a hand-driven node 1 connected to the NIC under test.
type fake struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func fakePeer(t *testing.T, n *NIC, node fabric.NodeID) *fake {
	t.Helper()
	c, err := net.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(rawHello(protoVersion, node)); err != nil {
		t.Fatal(err)
	}
	var b [helloSize]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		t.Fatalf("fake peer: read hello: %v", err)
	}
	if h, err := decodeHello(b[:]); err != nil || h.node != n.id {
		t.Fatalf("fake peer: hello %+v, %v", h, err)
	}
	waitUntil(t, "fake peer up", func() bool { return n.Alive(node) == nil })
	return &fake{t: t, c: c, br: bufio.NewReader(c)}
}

func (f *fake) Close() { f.c.Close() }

// frame writes one frame.
func (f *fake) frame(typ, flags uint8, a, b fabric.VPID, body ...[]byte) {
	f.t.Helper()
	n := 0
	for _, x := range body {
		n += len(x)
	}
	buf := make([]byte, prefixSize, prefixSize+n)
	putPrefix(buf, n, typ, flags, a, b)
	for _, x := range body {
		buf = append(buf, x...)
	}
	if _, err := f.c.Write(buf); err != nil {
		f.t.Fatalf("fake peer write: %v", err)
	}
}

// next reads frames until one of type typ (skipping heartbeats).
func (f *fake) next(typ uint8) (prefix, []byte) {
	f.t.Helper()
	f.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		var pb [prefixSize]byte
		if _, err := io.ReadFull(f.br, pb[:]); err != nil {
			f.t.Fatalf("fake peer: waiting for %s: %v", typeNames[typ], err)
		}
		p, err := decodePrefix(pb[:])
		if err != nil {
			f.t.Fatalf("fake peer: NIC sent a bad frame: %v", err)
		}
		body := make([]byte, p.n)
		if _, err := io.ReadFull(f.br, body); err != nil {
			f.t.Fatal(err)
		}
		if p.typ == typ {
			return p, body
		}
	}
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func u32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// TestBadFrames: an authenticated peer that breaks the frame protocol
// loses its session (counted), and the NIC carries on.
func TestBadFrames(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	n, _ := targetEP(t) // VPID 5 open while the peer misbehaves
	cases := []struct {
		name      string
		write     func(f *fake)
		oversized bool
	}{
		{"oversized", func(f *fake) { f.c.Write([]byte{0, 0, 0, 0x40, tPutData, 0, 0, 0}) }, true},
		{"just over the limit", func(f *fake) {
			var b [prefixSize]byte
			putPrefix(b[:], maxBody+1, tGetData, 0, 0, 0)
			f.c.Write(b[:])
		}, true},
		{"unknown type", func(f *fake) { f.frame(200, 0, 0, 0) }, false},
		{"type zero", func(f *fake) { f.frame(0, 0, 0, 0) }, false},
		{"heartbeat with body", func(f *fake) { f.frame(tHeartbeat, 0, 0, 0, []byte{1}) }, false},
		{"velo without credit", func(f *fake) {
			f.frame(tVELO, 0, 1, 5, u64(fabric.Descriptor{VPID: 5, Len: 1}.Encode()), []byte{9})
		}, false},
		{"velo length mismatch", func(f *fake) {
			f.frame(tVELO, 0, 1, 5, u64(fabric.Descriptor{VPID: 5, Len: 3}.Encode()), []byte{9})
		}, false},
		{"unrequested grant", func(f *fake) { f.frame(tGrant, 0, 0, 5, u32(10)) }, false},
		{"ack for no put", func(f *fake) { f.frame(tPutAck, 0, 0, 5, u64(12345)) }, false},
		{"data for no get", func(f *fake) { f.frame(tGetData, fLast, 5, 1, u64(12345), u32(0), []byte{1}) }, false},
		{"get-done for no get", func(f *fake) { f.frame(tGetDone, 0, 1, 5, u64(1)) }, false},
		{"put chunk past total", func(f *fake) { f.frame(tPutData, fLast, 1, 5, u64(1), u64(1<<40), u32(4), u32(2), []byte{1, 2, 3}) }, false},
		{"get of 0 bytes", func(f *fake) { f.frame(tGetReq, 0, 1, 5, u64(1), u64(1<<40), u32(0), u32(0)) }, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := fakePeer(t, n, 1)
			tc.write(f)
			expectClosed(t, f.c)
			waitUntil(t, "violation counted", func() bool { return n.NetStats().BadFrames == uint64(i+1) })
			waitUntil(t, "peer down", func() bool { return errors.Is(n.Alive(1), fabric.ErrPeerDown) })
		})
	}
	st := n.NetStats()
	if st.Oversized != 2 {
		t.Errorf("Oversized = %d, want 2", st.Oversized)
	}
	if c := n.Stats().Corrupt; c != uint64(len(cases)) {
		t.Errorf("Stats.Corrupt = %d, want %d", c, len(cases))
	}
}

// TestForgedRMA: RMA requests outside the regions of the addressed VPID
// get error answers, touch no memory and keep the session up.
func TestForgedRMA(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	n := target(t, nil)
	victim, _ := n.Open(5)
	other, _ := n.Open(6)
	defer victim.Close()
	defer other.Close()
	rv, _ := victim.Register(4096)
	ro, _ := other.Register(4096)
	for i := range ro.Buf {
		ro.Buf[i] = 0xEE
	}
	f := fakePeer(t, n, 1)
	cases := []struct {
		name   string
		vpid   fabric.VPID
		remote fabric.NLA
		n      uint32
		want   fabric.NotifyErr
	}{
		{"another vpid's region", 5, ro.NLA, 16, fabric.NErrAccess},
		{"past the end", 5, rv.NLA + 4090, 16, fabric.NErrBounds},
		{"huge offset", 5, rv.NLA + (1<<40 - 1), 16, fabric.NErrBounds},
		{"nla 0", 5, 0, 16, fabric.NErrAccess},
		{"unopened vpid", 7, rv.NLA, 16, fabric.NErrPeerDown},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := uint64(100 + i)
			// GET: answered with an error, no data.
			f.frame(tGetReq, 0, 1, tc.vpid, u64(id), u64(uint64(tc.remote)), u32(tc.n), u32(0))
			p, body := f.next(tGetData)
			if binary.LittleEndian.Uint64(body) != id || p.flags&fLast == 0 || fabric.NotifyErr(p.flags>>flagShift) != tc.want || p.payloadLen() != 0 {
				t.Fatalf("get answer: flags %#x len %d, want error %v", p.flags, p.payloadLen(), tc.want)
			}
			// PUT: data discarded, acked with the error.
			data := make([]byte, tc.n)
			f.frame(tPutData, fLast|uint8(fabric.NotifyCompleter)<<flagShift, 1, tc.vpid, u64(id), u64(uint64(tc.remote)), u32(tc.n), u32(0), data)
			p, body = f.next(tPutAck)
			if binary.LittleEndian.Uint64(body) != id || fabric.NotifyErr(p.flags>>flagShift) != tc.want {
				t.Fatalf("put ack: flags %#x, want error %v", p.flags, tc.want)
			}
		})
	}
	for i, b := range ro.Buf {
		if b != 0xEE {
			t.Fatalf("another VPID's region byte %d changed to %#x", i, b)
		}
	}
	for i, b := range rv.Buf {
		if b != 0 {
			t.Fatalf("victim region byte %d changed to %#x", i, b)
		}
	}
	var ns [4]fabric.Notification
	if k, _ := victim.PollNotifications(ns[:]); k != 0 {
		t.Fatalf("forged requests raised notifications: %+v", ns[:k])
	}
	if n.Alive(1) != nil || n.NetStats().BadFrames != 0 {
		t.Fatal("legitimate error cases cost the session")
	}
	// A valid GET through the same session works.
	copy(rv.Buf, "hello")
	f.frame(tGetReq, 0, 1, 5, u64(1), u64(uint64(rv.NLA)), u32(5), u32(0))
	_, body := f.next(tGetData)
	if string(body[12:]) != "hello" {
		t.Fatalf("valid get returned %q", body[12:])
	}
}

// TestPeerDiesMidRMA: requests outstanding at a peer that dies each end
// with exactly one NErrPeerDown requester notification.
func TestPeerDiesMidRMA(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	n := target(t, nil)
	ep, _ := n.Open(1)
	defer ep.Close()
	r, _ := ep.Register(1 << 20)
	f := fakePeer(t, n, 1)
	reqs := []fabric.RMA{
		{Op: fabric.OpGet, Peer: fabric.Addr{Node: 1, VPID: 3}, Local: r.NLA, Remote: 1 << 40, Len: 1 << 20, Notify: fabric.NotifyRequester},
		{Op: fabric.OpPut, Peer: fabric.Addr{Node: 1, VPID: 3}, Local: r.NLA, Remote: 1 << 40, Len: 1 << 20, Notify: fabric.NotifyCompleter},
	}
	if _, err := ep.Post(reqs); err != nil {
		t.Fatal(err)
	}
	f.next(tGetReq)  // the peer got the request ...
	f.next(tPutData) // ... and the first chunk of the put, then dies
	f.Close()
	var ns []fabric.Notification
	waitUntil(t, "two notifications", func() bool {
		var buf [4]fabric.Notification
		k, _ := ep.PollNotifications(buf[:])
		ns = append(ns, buf[:k]...)
		return len(ns) >= 2
	})
	for _, x := range ns {
		if x.Kind != fabric.KindRequester || x.Err != fabric.NErrPeerDown || x.Local != r.NLA {
			t.Fatalf("notification %+v, want requester NErrPeerDown", x)
		}
	}
	time.Sleep(20 * time.Millisecond)
	var buf [4]fabric.Notification
	if k, _ := ep.PollNotifications(buf[:]); k != 0 {
		t.Fatalf("extra notifications %+v", buf[:k])
	}
	if got := n.Stats().NotifyErrPeerDown; got != 2 {
		t.Fatalf("NotifyErrPeerDown = %d", got)
	}
}

// TestHalfOpen (heartbeat liveness): a peer that completes the handshake and then falls silent
// (its host froze, or the connection is half-open) is declared down once
// the clock passes DeadAfter, and a sender blocked on it returns.
func TestHalfOpen(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	clk := testenv.NewClock(time.Unix(1000, 0))
	const hb = 5 * time.Millisecond
	n := target(t, func(c *Config) {
		c.Liveness = LivenessHeartbeat
		c.Now = clk.Now
		c.Heartbeat = hb
		c.DeadAfter = 4 * hb
	})
	ep, _ := n.Open(1)
	defer ep.Close()
	f := fakePeer(t, n, 1)
	// A sender waiting for credits the silent peer never grants.
	ch := make(chan error, 1)
	go func() {
		_, err := ep.Send(context.Background(), []fabric.Message{{Peer: fabric.Addr{Node: 1, VPID: 1}}})
		ch <- err
	}()
	f.next(tCreditReq)
	// Real time passes, the fake clock does not: no timeout yet.
	time.Sleep(20 * hb)
	if n.Alive(1) != nil {
		t.Fatal("peer declared down before the clock moved")
	}
	clk.Advance(5 * hb)
	waitUntil(t, "half-open peer down", func() bool { return errors.Is(n.Alive(1), fabric.ErrPeerDown) })
	if err := testenv.Within(t, "blocked send", ch, 5*time.Second); !errors.Is(err, fabric.ErrPeerDown) {
		t.Fatalf("blocked send: %v, want ErrPeerDown", err)
	}
	if got := n.NetStats().HeartbeatTimeouts; got != 1 {
		t.Fatalf("HeartbeatTimeouts = %d, want 1", got)
	}
}

// TestHeartbeatKeepsIdleAlive (heartbeat liveness): two real nodes with a tight liveness
// budget stay connected while idle: heartbeats flow both ways.
func TestHeartbeatKeepsIdleAlive(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	// DeadAfter is far below the idle time, so only heartbeats keep the
	// session, yet 16 heartbeats long, so a goroutine stalled by a loaded
	// machine under -race does not look dead.
	nics := cluster(t, 2, func(c *Config) {
		c.Liveness = LivenessHeartbeat
		c.Heartbeat = 25 * time.Millisecond
		c.DeadAfter = 400 * time.Millisecond
	})
	time.Sleep(1500 * time.Millisecond)
	for _, n := range nics {
		if s := n.NetStats(); s.HeartbeatTimeouts != 0 || s.SessionsUp != 1 {
			t.Fatalf("node %d: %+v: idle session dropped", n.id, s)
		}
	}
}

// TestRestartRejoin: a node that closes and comes back on the same
// address rejoins the others without restarting them.
func TestRestartRejoin(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nics := cluster(t, 3, nil)
	addr := nics[1].Addr().String()
	nics[1].Close()
	for _, i := range []int{0, 2} {
		waitUntil(t, "node 2 down", func() bool { return errors.Is(nics[i].Alive(2), fabric.ErrPeerDown) })
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n2, err := open(Config{Node: 2, Listener: ln, Peers: nics[0].cfg.Peers, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	waitMesh(t, n2, 2)
	dst, _ := n2.Open(4)
	defer dst.Close()
	for _, i := range []int{0, 2} {
		waitUntil(t, "node 2 back", func() bool { return nics[i].Alive(2) == nil })
		src, _ := nics[i].Open(4)
		m := fabric.Message{Peer: dst.Addr(), Len: 1, Data: [120]byte{byte(i)}}
		if _, err := src.Send(context.Background(), []fabric.Message{m}); err != nil {
			t.Fatalf("node %d -> restarted node 2: %v", i+1, err)
		}
		var in [1]fabric.Message
		waitUntil(t, "message", func() bool { k, _ := dst.Recv(in[:]); return k == 1 })
		if in[0].Peer.Node != nics[i].id || in[0].Data[0] != byte(i) {
			t.Fatalf("got %+v", in[0])
		}
		src.Close()
	}
}
