package rdirect

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// plainEP hides BufferRegistrar.
type plainEP struct{ fabric.Endpoint }

func TestNewUnsupported(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nic, err := mem.NewCluster().NewNIC(1)
	if err != nil {
		t.Fatal(err)
	}
	defer nic.Close()
	ep, err := nic.Open(VPID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(plainEP{ep}, Config{}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("New on an endpoint without BufferRegistrar: %v, want ErrUnsupported", err)
	}
	// New closed ep: the VPID is free again.
	ep2, err := nic.Open(VPID)
	if err != nil {
		t.Fatalf("VPID still taken after New failed: %v", err)
	}
	ep2.Close()
}

// TestBothWays moves random-sized writes both ways at once through a
// MinRing connection (many wraps), checking every byte, on both fabric
// modes.
func TestBothWays(t *testing.T) {
	streams(t, 1<<20, 256<<10, func(t *testing.T, cl *cluster, p *pair, total int) {
		runAll(t, "stream", 60*time.Second,
			func() error { return writeStream(p.a.prog, 1, total, 3000, true) },
			func() error { return writeStream(p.b.prog, 2, total, 700, true) },
			func() error { return readStream(p.b.prog, 1, total, 2500, false) },
			func() error { return readStream(p.a.prog, 2, total, 5000, false) })
		for _, c := range []*Conn{p.a.c, p.b.c} {
			testenv.Within(t, "Done", doneCh(c), 5*time.Second)
		}
		s1, s2 := cl.eng[1].Stats(), cl.eng[2].Stats()
		// Every byte crossed once: by PUT, or inside a CDC (a small
		// write).
		if s1.PutBytes+s1.InlineBytes != uint64(total) || s2.PutBytes+s2.InlineBytes != uint64(total) {
			t.Fatalf("PUT+inline bytes %d+%d and %d+%d, want %d", s1.PutBytes, s1.InlineBytes, s2.PutBytes, s2.InlineBytes, total)
		}
		for _, s := range []Stats{s1, s2} {
			if v := violations(s); v != 0 || s.Unknown+s.Foreign+s.Late != 0 {
				t.Fatalf("stats %+v", s)
			}
		}
		t.Logf("node 1: %+v", s1)
	})
}

// streams runs f on every fabric mode with a fresh cluster and one
// MinRing connection (many wraps), checking for leaks; f moves total
// bytes (small under EXN_TEST_SMALL).
func streams(t *testing.T, total, small int, f func(t *testing.T, cl *cluster, p *pair, total int)) {
	if testenv.Small() {
		total = small
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			cl := newCluster(t, mode)
			f(t, cl, cl.dial(t, dring.MinRing), total)
		})
	}
}

// runAll runs every fn at once and fails t with the first error, or if
// they do not all end within d.
func runAll(t *testing.T, what string, d time.Duration, fns ...func() error) {
	t.Helper()
	errs := make(chan error, len(fns))
	for _, fn := range fns {
		go func() { errs <- fn() }()
	}
	for range fns {
		if err := testenv.Within(t, what, errs, d); err != nil {
			t.Fatal(err)
		}
	}
}

func doneCh(c *Conn) <-chan struct{} {
	ch := make(chan struct{}, 1)
	go func() { <-c.Done(); ch <- struct{}{} }()
	return ch
}

func violations(s Stats) (n uint64) {
	for r := Reason(0); r < NumReasons; r++ {
		if r.violation() || r == ReasonLocal || r == ReasonFabric {
			n += s.Resets[r]
		}
	}
	return n
}

// TestSlowReader has a writer faster than its reader: the writer fills
// the ring and parks, the engines say so (writer_blocked) and send
// window updates, and every byte arrives.
func TestSlowReader(t *testing.T) {
	streams(t, 512<<10, 128<<10, func(t *testing.T, cl *cluster, p *pair, total int) {
		runAll(t, "stream", 60*time.Second,
			func() error { return writeStream(p.a.prog, 7, total, 8192, true) },
			func() error { return readStream(p.b.prog, 7, total, 600, true) })
		s1, s2 := cl.eng[1].Stats(), cl.eng[2].Stats()
		if s2.PeerBlocked == 0 || s2.Updates == 0 {
			t.Fatalf("no blocked writer seen: node 1 %+v, node 2 %+v", s1, s2)
		}
		t.Logf("node 1 (writer): %+v", s1)
		t.Logf("node 2 (reader): %+v", s2)
	})
}

// TestEarly: the peer starts and its program writes (and closes) before
// this side's Start; the CDCs that came early are applied by Start.
func TestEarly(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			cl := newCluster(t, mode)
			p := cl.prepare(t, dring.MinRing)
			if err := p.b.c.Start(1, p.a.c.LocalID(), p.a.c.LocalNLA()); err != nil {
				t.Fatal(err)
			}
			if err := within(t, "write", 5*time.Second, func() error { return writeStream(p.b.prog, 3, 3000, 1000, true) }); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "early CDCs", 5*time.Second, func() bool { return cl.eng[1].Stats().CDCsRecv >= 1 })
			if err := p.a.c.Start(2, p.b.c.LocalID(), p.b.c.LocalNLA()); err != nil {
				t.Fatal(err)
			}
			if err := within(t, "read", 5*time.Second, func() error { return readStream(p.a.prog, 3, 3000, 1000, false) }); err != nil {
				t.Fatal(err)
			}
			exchangeAfterFin(t, p)
		})
	}
}

// exchangeAfterFin checks that A (whose peer sent fin) still gets to B.
func exchangeAfterFin(t *testing.T, p *pair) {
	t.Helper()
	msg := []byte("after the peer's fin")
	if _, err := p.a.prog.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if err := within(t, "read", 5*time.Second, func() error { return readFull(p.b.prog, got) }); err != nil || string(got) != string(msg) {
		t.Fatalf("read %q, %v", got, err)
	}
}

// TestClose covers what ends a connection: fin, rd_closed, the program's
// rst, Conn.Reset and Conn.Close before the end.
func TestClose(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, cl *cluster, p *pair)
	}{
		{"fin", func(t *testing.T, cl *cluster, p *pair) {
			werr := make(chan error, 1)
			go func() { werr <- writeStream(p.a.prog, 5, 10000, 999, true) }()
			if err := within(t, "read", 5*time.Second, func() error { return readStream(p.b.prog, 5, 10000, 999, false) }); err != nil {
				t.Fatal(err)
			}
			if err := testenv.Within(t, "write", werr, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := p.a.prog.Write([]byte("x")); err == nil {
				t.Fatal("write after CloseWrite succeeded")
			}
			exchangeBA(t, p)
			select {
			case <-p.a.c.Done():
				t.Fatal("Done before the peer's fin")
			default:
			}
			p.b.prog.CloseWrite()
			if _, err := within2(t, func() (int, error) { return p.a.prog.Read(make([]byte, 8)) }); err != io.EOF {
				t.Fatalf("A's read after B's fin: %v, want EOF", err)
			}
			testenv.Within(t, "Done A", doneCh(p.a.c), 5*time.Second)
			testenv.Within(t, "Done B", doneCh(p.b.c), 5*time.Second)
			if s := cl.eng[1].Stats(); s.Resets != ([NumReasons]uint64{}) {
				t.Fatalf("resets: %+v", s)
			}
		}},
		{"rd_closed", func(t *testing.T, cl *cluster, p *pair) {
			p.b.prog.CloseRead()
			err := within(t, "writes until refused", 10*time.Second, func() error {
				for {
					if _, err := p.a.prog.Write(make([]byte, 100)); err != nil {
						return err
					}
				}
			})
			if !errors.Is(err, dring.ErrPeerClosed) {
				t.Fatalf("A's write after B's CloseRead: %v, want ErrPeerClosed", err)
			}
		}},
		{"program-rst", func(t *testing.T, cl *cluster, p *pair) {
			p.a.prog.Reset()
			expectReset(t, p.b.prog)
			if r := cl.eng[1].Stats().Resets[ReasonProgram]; r != 1 {
				t.Fatalf("program resets %d", r)
			}
			if r := cl.eng[2].Stats().Resets[ReasonPeerReset]; r != 1 {
				t.Fatalf("peer resets %d", r)
			}
		}},
		{"conn-reset", func(t *testing.T, cl *cluster, p *pair) {
			p.a.c.Reset()
			expectReset(t, p.a.prog)
			expectReset(t, p.b.prog)
		}},
		{"close-early", func(t *testing.T, cl *cluster, p *pair) {
			if err := p.a.c.Close(); err != nil {
				t.Fatal(err)
			}
			expectReset(t, p.b.prog)
			if r := cl.eng[1].Stats().Resets[ReasonClose]; r != 1 {
				t.Fatalf("close resets %d", r)
			}
			if err := p.a.c.Start(2, 1, 1); !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Start after Close: %v", err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			cl := newCluster(t, modeOrdered)
			p := cl.dial(t, dring.MinRing)
			exchange(t, p, 300)
			tc.run(t, cl, p)
		})
	}
}

func exchangeBA(t *testing.T, p *pair) {
	t.Helper()
	if _, err := p.b.prog.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if err := within(t, "read", 5*time.Second, func() error { return readFull(p.a.prog, got) }); err != nil {
		t.Fatal(err)
	}
}

func within2(t *testing.T, f func() (int, error)) (int, error) {
	t.Helper()
	var n int
	err := within(t, "call", 5*time.Second, func() error {
		var err error
		n, err = f()
		return err
	})
	return n, err
}

// expectReset fails t unless ep's reads and writes fail with ErrReset
// within a bounded time.
func expectReset(t *testing.T, ep *dring.Endpoint) {
	t.Helper()
	if err := within(t, "read", 5*time.Second, func() error {
		for {
			if _, err := ep.Read(make([]byte, 64<<10)); err != nil {
				return err
			}
		}
	}); !isReset(err) {
		t.Fatalf("read: %v, want ErrReset", err)
	}
	// (A write after this side's own CloseWrite fails with ErrClosed.)
	if _, err := ep.Write([]byte("x")); !isReset(err) && !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write: %v, want ErrReset", err)
	}
}

// TestForged gives a connection CDCs that break each rule: each resets
// that connection alone (both programs see ErrReset) and is counted, or,
// not from the peer or for no connection, is dropped and counted; a
// second connection between the same engines keeps working.
func TestForged(t *testing.T) {
	R := uint64(dring.MinRing)
	cases := []struct {
		name   string
		prep   func(t *testing.T, p *pair)
		msg    func(c *Conn, s snap) fabric.Message
		reason Reason // NumReasons: dropped, not reset
		drop   func(s Stats) uint64
	}{
		{name: "replay", reason: ReasonSeq, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq, prod: s.recvTail, cons: s.recvHead})
		}},
		{name: "seq-gap", reason: ReasonSeq, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq + 2, prod: s.recvTail, cons: s.recvHead})
		}},
		{name: "tail-back", reason: ReasonTailBack, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq + 1, prod: s.recvTail - 1, cons: s.recvHead})
		}},
		{name: "window", reason: ReasonWindow, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq + 1, prod: s.sentHead + R + 1, cons: s.recvHead})
		}},
		{name: "head-back", reason: ReasonHeadBack, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.recvHead - 1})
		}},
		{name: "head-ahead", reason: ReasonHeadAhead, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.sentTail + 1})
		}},
		{name: "after-fin", reason: ReasonAfterFin,
			prep: func(t *testing.T, p *pair) {
				p.b.prog.CloseWrite()
				testenv.Eventually(t, "fin", 5*time.Second, func() bool { return p.a.c.snap().recvFin })
			},
			msg: func(c *Conn, s snap) fabric.Message {
				return forged(c, cdc{seq: s.seq + 1, prod: s.recvTail + 1, cons: s.recvHead, flags: flagFin})
			}},
		{name: "bad-magic", reason: ReasonMalformed, msg: func(c *Conn, s snap) fabric.Message {
			m := forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.recvHead})
			m.Data[0] ^= 0xFF
			return m
		}},
		{name: "bad-flags", reason: ReasonMalformed, msg: func(c *Conn, s snap) fabric.Message {
			m := forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.recvHead})
			m.Data[1] |= 0x40
			return m
		}},
		{name: "bad-nibble", reason: ReasonMalformed, msg: func(c *Conn, s snap) fabric.Message {
			m := forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.recvHead, upg: nibAtt})
			m.Data[2] |= 0x20
			return m
		}},
		{name: "forged-grant", reason: ReasonUpgrade, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.recvHead, upg: nibAtt, echo: nibAtt | nibMov})
		}},
		{name: "short", reason: ReasonMalformed, msg: func(c *Conn, s snap) fabric.Message {
			m := forged(c, cdc{seq: s.seq + 1, prod: s.recvTail, cons: s.recvHead})
			m.Len = 24
			return m
		}},
		{name: "unknown", reason: NumReasons, drop: func(s Stats) uint64 { return s.Unknown }, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{dst: c.id ^ 0x5555, seq: s.seq + 1, prod: s.recvTail + 1, cons: s.recvHead})
		}},
		{name: "other-node", reason: NumReasons, drop: func(s Stats) uint64 { return s.Foreign }, msg: func(c *Conn, s snap) fabric.Message {
			m := forged(c, cdc{seq: s.seq + 1, prod: s.recvTail - 1, cons: s.recvHead})
			m.Peer.Node = 3
			return m
		}},
		{name: "other-src", reason: NumReasons, drop: func(s Stats) uint64 { return s.Foreign }, msg: func(c *Conn, s snap) fabric.Message {
			return forged(c, cdc{src: c.peerID + 1, seq: s.seq + 1, prod: s.recvTail - 1, cons: s.recvHead})
		}},
		{name: "garbage-other-node", reason: NumReasons, drop: func(s Stats) uint64 { return s.Unknown }, msg: func(c *Conn, s snap) fabric.Message {
			m := forged(c, cdc{seq: s.seq + 1})
			m.Data[0] = 0
			m.Peer.Node = 3
			return m
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			cl := newCluster(t, modeOrdered)
			victim, other := cl.dial(t, dring.MinRing), cl.dial(t, dring.MinRing)
			// A sends, B reads then answers: the victim's engine on
			// node 1 has a tail and a head from its peer.
			exchange(t, victim, 300)
			exchange(t, other, 300)
			if tc.prep != nil {
				tc.prep(t, victim)
			}
			c := victim.a.c
			s := c.snap()
			if s.recvTail == 0 || s.recvHead == 0 || s.sentTail == 0 {
				t.Fatalf("set-up: %+v", s)
			}
			before := cl.eng[1].Stats()
			m := tc.msg(c, s)
			cl.eng[1].handle(&m)
			after := cl.eng[1].Stats()
			if tc.reason == NumReasons {
				if after.Resets != before.Resets || tc.drop(after) != tc.drop(before)+1 {
					t.Fatalf("stats before %+v, after %+v", before, after)
				}
				if c.snap() != s {
					t.Fatalf("state moved: %+v → %+v", s, c.snap())
				}
				exchange(t, victim, 1000)
			} else {
				if got := after.Resets[tc.reason] - before.Resets[tc.reason]; got != 1 {
					t.Fatalf("resets %v: %d (stats %+v)", tc.reason, got, after)
				}
				// Gone in the upgrade word, before the program was rung;
				// the forged CDC changed nothing else in it.
				if w := victim.a.upg.Load(); w != dring.UpgGone {
					t.Fatalf("upgrade word %#x, want gone alone", w)
				}
				expectReset(t, victim.a.prog)
				expectReset(t, victim.b.prog)
				if r := cl.eng[2].Stats().Resets[ReasonPeerReset]; r != 1 {
					t.Fatalf("peer's engine got %d rsts", r)
				}
				testenv.Eventually(t, "gone in the peer's copy", 5*time.Second, func() bool {
					return victim.b.upg.Load() == dring.UpgGone
				})
			}
			exchange(t, other, 5000)
			if other.a.c.dead.Load() || other.b.c.dead.Load() {
				t.Fatal("the other connection was reset")
			}
		})
	}
}

// TestLocalCorrupt: a program that moves its tail past the window resets
// its own connection only.
func TestLocalCorrupt(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	cl := newCluster(t, modeOrdered)
	victim, other := cl.dial(t, dring.MinRing), cl.dial(t, dring.MinRing)
	exchange(t, victim, 100)
	victim.a.ctl[0].Tail.Swap(1 << 40)
	victim.a.prog.CloseWrite() // rings the engine
	testenv.Eventually(t, "local reset", 5*time.Second, func() bool { return cl.eng[1].Stats().Resets[ReasonLocal] == 1 })
	expectReset(t, victim.b.prog)
	exchange(t, other, 5000)
}

// TestPeerGone: the peer's engine closes, or its node goes down, in the
// middle of a transfer or while idle: this side's program gets ErrReset
// within bounded time.
func TestPeerGone(t *testing.T) {
	cases := []struct {
		name     string
		busy     bool
		liveness bool
		kill     func(cl *cluster)
	}{
		{"engine-close-busy", true, false, func(cl *cluster) { cl.eng[2].Close() }},
		{"engine-close-idle", false, false, func(cl *cluster) { cl.eng[2].Close() }},
		{"node-down-busy", true, true, func(cl *cluster) { cl.nics[2].Close() }},
		{"node-down-idle", false, true, func(cl *cluster) { cl.nics[2].Close() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			testenv.VerifyNoLeaks(t)
			cl := newCluster(t, modeOrdered, func(cl *cluster, n int, c *Config) {
				if tc.liveness && n == 1 {
					c.LivenessPeriod = 20 * time.Millisecond
					c.Liveness = cl.nics[1]
				}
			})
			p := cl.dial(t, dring.MinRing)
			exchange(t, p, 500)
			werr := make(chan error, 1)
			if tc.busy {
				go func() {
					buf := make([]byte, 1000)
					for {
						if _, err := p.a.prog.Write(buf); err != nil {
							werr <- err
							return
						}
					}
				}()
				go func() { // B reads until its side is gone
					buf := make([]byte, 4096)
					for {
						if _, err := p.b.prog.Read(buf); err != nil {
							return
						}
					}
				}()
				time.Sleep(20 * time.Millisecond)
			}
			tc.kill(cl)
			if tc.busy {
				if err := testenv.Within(t, "writer", werr, 5*time.Second); !isReset(err) {
					t.Fatalf("A's write: %v, want ErrReset", err)
				}
			}
			expectReset(t, p.a.prog)
		})
	}
}

// TestIdle: after traffic on many connections stops, both engines park
// (each connection armed in its buffer) and wake no more.
func TestIdle(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	n := 100
	if testenv.Small() {
		n = 20
	}
	cl := newCluster(t, modeOrdered)
	ps := make([]*pair, n)
	for i := range ps {
		ps[i] = cl.dial(t, dring.MinRing)
		exchange(t, ps[i], 64)
	}
	quiet := func() bool {
		w1, w2 := cl.eng[1].Stats().Wakes, cl.eng[2].Stats().Wakes
		time.Sleep(100 * time.Millisecond)
		return cl.eng[1].Stats().Wakes == w1 && cl.eng[2].Stats().Wakes == w2
	}
	testenv.Eventually(t, "100 ms without a wake-up", 5*time.Second, quiet)
	for i, p := range ps {
		if w := p.a.ctl[0].ConsWait.Load(); w != 1 {
			t.Fatalf("conn %d: cons_wait[0] on node 1 = %d, want 1 (armed)", i, w)
		}
		if w := p.b.ctl[1].ConsWait.Load(); w != 1 {
			t.Fatalf("conn %d: cons_wait[1] on node 2 = %d, want 1 (armed)", i, w)
		}
	}
	// An armed connection wakes its engine at once.
	exchange(t, ps[n/2], 1000)
	t.Logf("node 1: %+v", cl.eng[1].Stats())
}

// TestEngineClose: a closed Engine refuses work; Conns closed afterwards
// close cleanly.
func TestEngineClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	cl := newCluster(t, modeOrdered)
	p := cl.dial(t, dring.MinRing)
	exchange(t, p, 100)
	if err := cl.eng[1].Close(); err != nil {
		t.Fatal(err)
	}
	if err := cl.eng[1].Close(); err != nil {
		t.Fatal(err)
	}
	expectReset(t, p.a.prog)
	expectReset(t, p.b.prog)
	if _, err := cl.eng[1].Prepare(p.a.mem, 0, p.a.fs.Bell[1]); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Prepare after Close: %v", err)
	}
	if err := p.a.c.Close(); err != nil {
		t.Fatal(err)
	}
}
