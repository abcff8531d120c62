package extds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/internal/testenv"
)

func TestProbe(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	lnPort := p.ln.Addr().(*net.TCPAddr).Port
	// A port on the listener's vdev (open on node B) and one on a vdev
	// that nothing opened there.
	sameVdev := uint16(lnPort) ^ 0x10
	closedVdev := uint16(lnPort)&^0xF | (uint16(lnPort)+5)&0xF // vdev differs from lnPort's
	if closedVdev&0xF == 4000&0xF {
		closedVdev = closedVdev&^0xF | (closedVdev+5)&0xF
	}
	unreg, err := p.devB.RegisterPort(4000)
	if err != nil {
		t.Fatal(err)
	}
	unreg2, err := p.devB.RegisterPort(4000) // counted registrations
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		node     fabric.NodeID
		port     uint16
		setup    func()
		want     bool
		answered bool // the peer's Device answered (vs. the send failed)
	}{
		{"listener", nodeB, uint16(lnPort), nil, true, true},
		{"registered", nodeB, 4000, nil, true, true},
		{"one-of-two-unregistered", nodeB, 4000, unreg, true, true},
		{"unregister-idempotent", nodeB, 4000, unreg, true, true},
		{"all-unregistered", nodeB, 4000, unreg2, false, true},
		{"unregistered-open-vdev", nodeB, sameVdev, nil, false, true},
		{"vdev-not-open", nodeB, closedVdev, nil, false, false},
		{"unknown-node", 99, uint16(lnPort), nil, false, false},
		{"self-not-listening", nodeA, uint16(lnPort), nil, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			served := p.devB.Stats().ProbesServed
			start := time.Now()
			got, err := p.devA.Probe(t.Context(), tc.node, 12345, tc.port)
			if err != nil || got != tc.want {
				t.Fatalf("Probe = %v, %v; want %v", got, err, tc.want)
			}
			if d := time.Since(start); d > 40*time.Millisecond {
				t.Errorf("probe took %v: an answer (or a failed send) should be immediate", d)
			}
			if n := p.devB.Stats().ProbesServed - served; (n == 1) != (tc.answered && tc.node == nodeB) {
				t.Errorf("served %d probes", n)
			}
			if tc.node == nodeB && p.devB.Listening(tc.port) != tc.want {
				t.Errorf("Listening(%d) = %v", tc.port, !tc.want)
			}
		})
	}
	if st := p.devA.Stats(); st.ProbeTimeouts != 0 || st.TotalDrops() != 0 {
		t.Fatalf("client stats: timeouts %d drops %v", st.ProbeTimeouts, st.Drops)
	}
	// A cancelled context is an error, not a "no".
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := p.devA.Probe(ctx, nodeB, 12345, uint16(lnPort)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled probe: %v", err)
	}
}

// TestProbeTimeout: a vdev that is open but never answers (a raw endpoint
// in the Device's VPID) costs one probe timeout and counts as "no".
func TestProbeTimeout(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithProbeTimeout(30*time.Millisecond))
	port := uint16(p.ln.Addr().(*net.TCPAddr).Port+1) & 0xF // not the listener's vdev
	// The vdev is open on node B, but nothing answers on it.
	fabrictest.OpenEP(t, p.nicB, p.devB.VPID(port))
	start := time.Now()
	got, err := p.devA.Probe(t.Context(), nodeB, 1, port)
	if err != nil || got {
		t.Fatalf("Probe = %v, %v", got, err)
	}
	if d := time.Since(start); d < 25*time.Millisecond || d > time.Second {
		t.Fatalf("probe returned after %v, want about the 30ms timeout", d)
	}
	if n := p.devA.Stats().ProbeTimeouts; n != 1 {
		t.Fatalf("probe timeouts %d", n)
	}
}

// TestForgedProbes: malformed probes, probes on the wrong vdev and
// replies nobody asked for are counted drops; the Device keeps answering.
func TestForgedProbes(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	raw := fabrictest.OpenEP(t, p.nicA, 200)
	lnPort := uint16(p.ln.Addr().(*net.TCPAddr).Port)
	to := fabric.Addr{Node: nodeB, VPID: p.devB.VPID(lnPort)}
	probe := func(tag fabric.Tag, tok uint32, port uint16, st, rsv byte) fabric.Message {
		return rawMsg(to, tag, append(le32(tok), byte(port), byte(port>>8), st, rsv)...)
	}
	msgs := []struct {
		name string
		m    fabric.Message
		drop DropReason
	}{
		{"probe-short", rawMsg(to, TagProbe, le32(5)...), DropMalformed},
		{"probe-token-0", probe(TagProbe, 0, lnPort, 0, 0), DropMalformed},
		{"probe-port-0", probe(TagProbe, 5, 0, 0, 0), DropMalformed},
		{"probe-status-set", probe(TagProbe, 5, lnPort, 1, 0), DropMalformed},
		{"probe-reserved-set", probe(TagProbe, 5, lnPort, 0, 9), DropMalformed},
		{"probe-wrong-vdev", probe(TagProbe, 5, lnPort^1, 0, 0), DropProbe},
		{"reply-status-2", probe(TagProbeRep, 5, lnPort, 2, 0), DropMalformed},
		{"reply-unsolicited", probe(TagProbeRep, 5, lnPort, 1, 0), DropProbe},
		{"noconn-unknown", rawMsg(to, TagNoConn, le32(77)...), DropUnknownConn},
	}
	for _, tc := range msgs {
		before := p.devB.Stats().Drops[tc.drop.String()]
		if _, err := raw.Send(context.Background(), []fabric.Message{tc.m}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, tc.name+": drop "+tc.drop.String(), 2*time.Second, func() bool {
			return p.devB.Stats().Drops[tc.drop.String()] == before+1
		})
	}
	if ok, err := p.devA.Probe(t.Context(), nodeB, 1, lnPort); !ok || err != nil {
		t.Fatalf("probe after forgeries: %v, %v", ok, err)
	}
	c, s := p.openConns(t)
	transfer(t, c, s, []int{100, 10000}, c.Write)
}

// TestNoConnUnblocksWriter: the server's connection disappears without a
// word (released, its RESET lost). The client's next data messages get
// NOCONN, and a writer blocked on credits fails with ECONNRESET instead of
// waiting forever.
func TestNoConnUnblocksWriter(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithRingSize(wire.MinRingSize), WithEagerWindow(1024))
	c, s := p.conns(t)
	defer c.Close()
	// Fill the server's buffers so the writer blocks on credits.
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 1<<20))
		errc <- err
	}()
	testenv.Eventually(t, "writer blocked on credits", 2*time.Second, func() bool { return p.devA.Stats().CreditWaits > 0 })
	// Silently release the server side: no RESET, no SHUTDOWN.
	s.mu.Lock()
	s.closed = true
	s.err = net.ErrClosed
	s.releaseLocked()
	s.mu.Unlock()
	// The writer is blocked, so nothing is in flight to the server yet;
	// a writer only hears NOCONN once it sends. A small write from another
	// goroutine would queue behind wmu, so poke with a stale data message
	// from the client's own endpoint instead: what an in-flight fragment
	// would look like.
	var m [1]fabric.Message
	wire.EncData(&m[0], c.peerAddr, c.peerID, true, []byte("x"))
	if _, err := c.vd.ep.Send(t.Context(), m[:]); err != nil {
		t.Fatal(err)
	}
	err := testenv.Within(t, "a writer whose peer connection vanished", errc, 5*time.Second)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("blocked write: %v, want ECONNRESET", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("write error %T is not a *net.OpError", err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after NOCONN: %v", err)
	}
	// At least the poke is answered; a fragment of the blocked writer
	// that was already in flight may be answered too (one NOCONN each).
	// The server counts a NOCONN after its send returns, which can be
	// after the client acted on it.
	testenv.Eventually(t, "the server's NOCONN counted", 2*time.Second, func() bool {
		st := p.devB.Stats()
		return st.NoConnSent >= 1 && st.Drops["unknown_conn"] >= st.NoConnSent
	})
	if r, n := p.devA.Stats().ResetsRecv, p.devB.Stats().NoConnSent; r < 1 || r > n {
		t.Fatalf("client resets received %d, want 1..%d (the NOCONNs sent)", r, n)
	}
}

// TestNoConnInFlight: data sent after the server's connection was
// released (silently, or after a graceful close that fully drained) is
// answered with NOCONN, and the writer fails with ECONNRESET like a TCP
// writer whose peer answers RST.
func TestNoConnInFlight(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name    string
		release func(t *testing.T, p *pair, c, s *Conn)
	}{
		{"silent-release", func(t *testing.T, p *pair, c, s *Conn) {
			s.mu.Lock()
			s.closed = true
			s.err = net.ErrClosed
			s.releaseLocked()
			s.mu.Unlock()
		}},
		{"graceful-close-drained", func(t *testing.T, p *pair, c, s *Conn) {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("client read: %v, want EOF", err)
			}
			c.SetReadDeadline(time.Time{})
			testenv.Eventually(t, "server released", 2*time.Second, func() bool { return p.devB.Stats().Active == 0 })
		}},
	}
	for _, tc := range tests {
		// Small writes go by VELO only, so NOCONN is what stops them;
		// large ones PUT into the released ring first, whose access
		// error notification is a reset as well.
		for _, size := range []int{100, 64 << 10} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, size), func(t *testing.T) {
				p := newPair(t)
				c, s := p.conns(t)
				defer c.Close()
				tc.release(t, p, c, s)
				deadline := time.Now().Add(5 * time.Second)
				var err error
				for time.Now().Before(deadline) {
					if _, err = c.Write(make([]byte, size)); err != nil {
						break
					}
				}
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("write: %v, want ECONNRESET", err)
				}
				if size <= DefaultThreshold {
					// Counted after the send returns: maybe after the
					// writer acted on it.
					testenv.Eventually(t, "a NOCONN counted", 2*time.Second, func() bool { return p.devB.Stats().NoConnSent >= 1 })
				}
			})
		}
	}
}

// TestNoConnForged: a NOCONN naming a live connection's peer ID but sent
// from another endpoint changes nothing.
func TestNoConnForged(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.openConns(t)
	raw := fabrictest.OpenEP(t, p.nicB, 201)
	before := p.devA.Stats().Drops["unknown_conn"]
	m := rawMsg(c.vd.ep.Addr(), TagNoConn, le32(c.peerID)...)
	if _, err := raw.Send(t.Context(), []fabric.Message{m}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "forged noconn dropped", 2*time.Second, func() bool {
		return p.devA.Stats().Drops["unknown_conn"] == before+1
	})
	transfer(t, c, s, []int{10, 5000}, c.Write)
}

// TestNoConnRateLimit: a flood of data for unknown connections gets at
// most noConnLimit NOCONN replies a second; the rest are counted.
func TestNoConnRateLimit(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	raw := fabrictest.OpenEP(t, p.nicA, 202)
	to := fabric.Addr{Node: nodeB, VPID: p.devB.VPID(uint16(p.ln.Addr().(*net.TCPAddr).Port))}
	const n = noConnLimit + 100
	batch := make([]fabric.Message, 0, 32)
	got := make([]fabric.Message, 64)
	received := 0
	for i := 0; i < n; i++ {
		batch = append(batch, rawMsg(to, TagVELO, append(le32(uint32(1000+i)), 'x')...))
		if len(batch) == cap(batch) || i == n-1 {
			if _, err := raw.Send(t.Context(), batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
		k, _ := raw.Recv(got) // keep our mailbox drained
		received += k
	}
	testenv.Eventually(t, "all counted", 3*time.Second, func() bool {
		st := p.devB.Stats()
		return st.Drops["unknown_conn"] == n && st.NoConnSent+st.NoConnLimited+st.Drops["ctrl_queue"] == n
	})
	st := p.devB.Stats()
	// The limit is per calendar second: a run straddling a second
	// boundary may send up to twice the limit.
	if st.NoConnSent > 2*noConnLimit || st.NoConnLimited == 0 && st.Drops["ctrl_queue"] == 0 {
		t.Fatalf("noconn sent %d limited %d ctrl_queue %d", st.NoConnSent, st.NoConnLimited, st.Drops["ctrl_queue"])
	}
}

// TestForgedMessagesFromStranger: a raw endpoint on the client's node
// sends garbage and forgeries to the server's vdev. Each is a counted
// drop; the real connection is untouched.
func TestForgedMessagesFromStranger(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.openConns(t)
	raw := fabrictest.OpenEP(t, p.nicA, 200)
	to := s.vd.ep.Addr()
	valid := le32(s.id)
	msgs := []struct {
		m    fabric.Message
		drop DropReason
	}{
		{rawMsg(to, 0x01, valid...), DropMalformed},                                         // EXT-Eth tag
		{rawMsg(to, TagVELO, 1, 2), DropMalformed},                                          // short
		{rawMsg(to, TagVELO, 0, 0, 0, 0, 'x'), DropMalformed},                               // conn 0
		{rawMsg(to, TagVELO, valid...), DropMalformed},                                      // empty fragment
		{rawMsg(to, TagRMAInfo, append(valid, 1, 2, 3)...), DropMalformed},                  // bad length
		{rawMsg(to, TagVELO, append(le32(s.id+1000), 'x')...), DropUnknownConn},             // unknown conn
		{rawMsg(to, TagVELO, append(append([]byte{}, valid...), 'x')...), DropPeerMismatch}, // right conn, wrong source
		{rawMsg(to, TagReset, valid...), DropPeerMismatch},
	}
	for i := range msgs {
		before := p.devB.Stats().Drops[msgs[i].drop.String()]
		if _, err := raw.Send(context.Background(), []fabric.Message{msgs[i].m}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "drop "+msgs[i].drop.String(), 2*time.Second, func() bool {
			return p.devB.Stats().Drops[msgs[i].drop.String()] == before+1
		})
	}
	transfer(t, c, s, []int{10, 5000, 100}, c.Write)
}

// TestProtocolViolationFromPeer: the connection's own peer address breaks
// the protocol. Only that connection is reset; a sibling on the same
// vdev pair keeps working.
func TestProtocolViolationFromPeer(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name    string
		payload func(s *Conn) (fabric.Tag, []byte)
	}{
		{"credit-overflow", func(s *Conn) (fabric.Tag, []byte) {
			return TagRMAAvail, append(append(le32(s.id), le32(1)...), le32(0)...)
		}},
		{"rma-info-outside-ring", func(s *Conn) (fabric.Tag, []byte) {
			return TagRMAInfo, append(append(le32(s.id), le32(0)...), le32(s.ringSize+1)...)
		}},
		{"rma-info-wrong-offset", func(s *Conn) (fabric.Tag, []byte) {
			return TagRMAInfo, append(append(le32(s.id), le32(64)...), le32(10)...)
		}},
		{"eager-overflow", nil},
		{"unexpected-zc-done", func(s *Conn) (fabric.Tag, []byte) { return TagZCDone, le32(s.id) }},
		{"duplicate-shutdown", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, WithEagerWindow(1024))
			c, s := p.openConns(t)
			c2, s2 := p.conns(t) // sibling: same server port, so same server vdev
			defer c2.Close()
			defer s2.Close()
			from := c.vd.ep // the real peer address of s
			var batch []fabric.Message
			switch tc.name {
			case "eager-overflow":
				for i := 0; i < 1024/wire.FragData+2; i++ {
					var m fabric.Message
					wire.EncData(&m, s.vd.ep.Addr(), s.id, false, make([]byte, wire.FragData))
					batch = append(batch, m)
				}
			case "duplicate-shutdown":
				for i := 0; i < 2; i++ {
					var m fabric.Message
					wire.EncCtl(&m, s.vd.ep.Addr(), TagShutdown, s.id)
					batch = append(batch, m)
				}
			default:
				tag, pl := tc.payload(s)
				batch = append(batch, rawMsg(s.vd.ep.Addr(), tag, pl...))
			}
			if _, err := from.Send(context.Background(), batch); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "protocol drop", 2*time.Second, func() bool { return p.devB.Stats().Drops["protocol"] == 1 })
			buf := make([]byte, 4096)
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				if _, err := s.Read(buf); err != nil {
					if !errors.Is(err, ErrProtocol) {
						t.Fatalf("server read: %v, want ErrProtocol", err)
					}
					break
				}
			}
			// The peer is told with RESET.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("client read: %v, want ECONNRESET", err)
			}
			transfer(t, c2, s2, []int{1, 1000, 70000}, c2.Write)
		})
	}
}
