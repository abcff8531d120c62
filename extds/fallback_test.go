package extds

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

func echo(c net.Conn) { io.Copy(c, c) }

// lineEcho answers only complete lines, so a binary hello gets no reply.
func lineEcho(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return
		}
		io.WriteString(c, l)
	}
}

func roundtrip(t testing.TB, c net.Conn, msg string) {
	t.Helper()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(c, b); err != nil || string(b) != msg {
		t.Fatalf("roundtrip got %q, %v", b, err)
	}
	c.SetReadDeadline(time.Time{})
}

// recorder is a plain server handler that keeps what it received.
type recorder struct {
	mu  sync.Mutex
	got []byte
}

func (r *recorder) handle(inner func(net.Conn)) func(net.Conn) {
	return func(c net.Conn) { inner(&recConn{Conn: c, r: r}) }
}

func (r *recorder) bytes() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return string(r.got)
}

type recConn struct {
	net.Conn
	r *recorder
}

func (c *recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.got = append(c.r.got, p[:n]...)
	c.r.mu.Unlock()
	return n, err
}

func TestFallbackClientSide(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name     string
		handle   func(net.Conn)
		resolver Resolver
		register bool // the server's Device claims a listener on the port
		reason   FallbackReason
	}{
		{"no-route", echo, StaticResolver{}, false, FallbackNoRoute},
		{"no-listener", echo, nil, false, FallbackNoListener},
		{"no-listener-silent-server", lineEcho, nil, false, FallbackNoListener},
		// Second line of defense: the port is registered but the server
		// does not speak EXT-DS.
		{"registered-plain-echo-server", echo, nil, true, FallbackHandshake},
		{"registered-silent-plain-server", lineEcho, nil, true, FallbackHandshake},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, WithHandshakeTimeout(200*time.Millisecond))
			var rec recorder
			addr := testenv.ServeTCP(t, rec.handle(tc.handle))
			if tc.register {
				ap := netip.MustParseAddrPort(addr)
				unreg, err := p.devB.RegisterPort(ap.Port())
				if err != nil {
					t.Fatal(err)
				}
				defer unreg()
			}
			d := &Dialer{Device: p.devA, Resolver: tc.resolver}
			start := time.Now()
			c, err := d.DialConn(t.Context(), "tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Mode() != ModeTCP {
				t.Fatalf("mode %v, want tcp", c.Mode())
			}
			if r, ok := c.FallbackReason(); !ok || r != tc.reason {
				t.Fatalf("FallbackReason() = %v, %v; want %v", r, ok, tc.reason)
			}
			if tc.reason == FallbackNoListener && time.Since(start) > 40*time.Millisecond {
				// The probe is answered "no" at once (the port's vdev is
				// not open on node B): no probe timeout was waited for.
				t.Errorf("no-listener dial took %v", time.Since(start))
			}
			roundtrip(t, c, "hello over tcp\n")
			if got := p.devA.Stats().Fallbacks[tc.reason.String()]; got != 1 {
				t.Fatalf("fallbacks[%v] = %d, want 1", tc.reason, got)
			}
			if tc.reason != FallbackHandshake {
				// Nothing but the application's bytes reached the server.
				if got := rec.bytes(); got != "hello over tcp\n" {
					t.Fatalf("plain server received %q", got)
				}
			}
			if tc.reason == FallbackHandshake {
				// The address is remembered: the next dial does not wait.
				start := time.Now()
				c2, err := d.DialConn(t.Context(), "tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				c2.Close()
				if time.Since(start) > 100*time.Millisecond || p.devA.Stats().Fallbacks["cached"] != 1 {
					t.Fatalf("second dial took %v, cached %d", time.Since(start), p.devA.Stats().Fallbacks["cached"])
				}
			}
		})
	}
}

func TestFallbackServerSide(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithPeekTimeout(100*time.Millisecond))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2; i++ {
			c, err := p.ln.AcceptConn()
			if err != nil {
				return
			}
			if c.Mode() != ModeTCP {
				t.Errorf("accepted mode %v, want tcp", c.Mode())
			}
			go func() {
				defer c.Close()
				if i == 1 { // server speaks first
					io.WriteString(c, "banner\n")
				}
				echo(c)
			}()
		}
	}()
	// A plain client that speaks first: bytes are peeked and replayed.
	c, err := net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundtrip(t, c, "EX") // a prefix of the magic, then nothing
	roundtrip(t, c, "plain client\n")
	c.Close()
	// A plain client that waits for a banner: served after PeekTimeout.
	c, err = net.Dial("tcp", p.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 7)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "banner\n" {
		t.Fatalf("banner %q, %v", b, err)
	}
	c.Close()
	<-done
	if got := p.devB.Stats().Fallbacks["plain_client"]; got != 2 {
		t.Fatalf("plain_client fallbacks %d, want 2", got)
	}
}

// TestNoDevice: a nil Device is plain TCP both ways.
func TestNoDevice(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ln, err := Listen(nil, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			echo(c)
			c.Close()
		}
	}()
	c, err := Dial(nil, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundtrip(t, c, "x")
	c.Close()
	_ = fabric.NodeID(0)
	_ = netip.Addr{}
}
