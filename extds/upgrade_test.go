package extds

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/internal/testenv"
)

// shadowPair connects a plain TCP socket pair over loopback: the client
// end and the server's accepted end.
func shadowPair(t testing.TB, ln net.Listener) (client, server net.Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	if server == nil {
		t.Fatal("accept failed")
	}
	return client, server
}

// peekConn emulates MSG_PEEK for tests: the first bytes were read, and
// are returned again by the next Reads.
func peekFirst(t testing.TB, c net.Conn, n int) (net.Conn, []byte) {
	t.Helper()
	b := make([]byte, n)
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	k, _ := io.ReadFull(c, b)
	c.SetReadDeadline(time.Time{})
	return &replayConn{Conn: c, pre: append([]byte(nil), b[:k]...)}, b[:k]
}

func TestUpgradeAcceptShadow(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	ln := registeredListener(t, p.devB)
	cl, sv := shadowPair(t, ln)
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		sh, peeked := peekFirst(t, sv, HelloPrefixLen)
		c, err := p.devB.AcceptShadow(t.Context(), sh, peeked)
		ch <- res{c, err}
	}()
	c, err := p.dialer.Upgrade(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	s := r.c
	if c.Mode() != ModeEXTDS || s.Mode() != ModeEXTDS {
		t.Fatalf("modes %v/%v", c.Mode(), s.Mode())
	}
	transfer(t, c, s, []int{1, 400, 70000, 1 << 20}, c.Write)
	transfer(t, s, c, []int{3000, 1 << 20}, s.Write)
	c.Close()
	if _, err := io.ReadAll(s); err != nil {
		t.Fatalf("server read to EOF: %v", err)
	}
	s.Close()
	testenv.Eventually(t, "released", 2*time.Second, func() bool { return p.devA.Stats().Active == 0 && p.devB.Stats().Active == 0 })
}

// TestUpgradeFallback: Upgrade to a port with no registered listener
// returns the shadow untouched; AcceptShadow of a plain client does not
// consume its bytes.
func TestUpgradeFallback(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	ln := testenv.ListenTCP(t)
	tests := []struct {
		name     string
		resolver Resolver
		reason   FallbackReason
	}{
		{"no-listener", nil, FallbackNoListener},
		{"no-route", StaticResolver{}, FallbackNoRoute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cl, sv := shadowPair(t, ln)
			defer sv.Close()
			d := &Dialer{Device: p.devA, Resolver: tc.resolver}
			c, err := d.Upgrade(t.Context(), cl)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if r, ok := c.FallbackReason(); c.Mode() != ModeTCP || !ok || r != tc.reason {
				t.Fatalf("mode %v reason %v %v", c.Mode(), r, ok)
			}
			io.WriteString(c, "app bytes")
			sh, peeked := peekFirst(t, sv, HelloPrefixLen)
			if string(peeked) != "app " {
				t.Fatalf("server saw %q first: something was written before the app", peeked)
			}
			s, err := p.devB.AcceptShadow(t.Context(), sh, peeked)
			if err != nil || s.Mode() != ModeTCP {
				t.Fatalf("AcceptShadow: %v", err)
			}
			if r, _ := s.FallbackReason(); r != FallbackPlainPeer {
				t.Fatalf("server reason %v", r)
			}
			b := make([]byte, 9)
			if _, err := io.ReadFull(s, b); err != nil || string(b) != "app bytes" {
				t.Fatalf("server app read %q, %v", b, err)
			}
		})
	}
}

func TestClassifyPeek(t *testing.T) {
	tests := []struct {
		in           string
		hello, plain bool
	}{
		{"", false, false},
		{"E", false, false},
		{"EXD", false, false},
		{"EXDS", true, false},
		{"EXDSxxxx", true, false},
		{"EXDR", false, true},
		{"GET ", false, true},
		{"X", false, true},
	}
	for _, tc := range tests {
		h, p := ClassifyPeek([]byte(tc.in))
		if h != tc.hello || p != tc.plain {
			t.Errorf("ClassifyPeek(%q) = %v, %v; want %v, %v", tc.in, h, p, tc.hello, tc.plain)
		}
	}
}

// TestAcceptShadowBadHello: a stream that starts like a hello but is not
// one is an error, and the socket is shut down (its content is garbage to
// the application).
func TestAcceptShadowBadHello(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithHandshakeTimeout(100*time.Millisecond))
	ln := testenv.ListenTCP(t)
	tests := []struct {
		name string
		send string
	}{
		{"garbage-after-magic", "EXDS" + string(make([]byte, 28))},
		{"short-hello-then-silence", "EXDS\x01"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cl, sv := shadowPair(t, ln)
			defer cl.Close()
			defer sv.Close()
			io.WriteString(cl, tc.send)
			peeked := []byte(tc.send[:HelloPrefixLen])
			c, err := p.devB.AcceptShadow(t.Context(), sv, peeked)
			var oe *net.OpError
			if err == nil || c != nil || !errors.As(err, &oe) {
				t.Fatalf("AcceptShadow: conn %v, err %v; want *net.OpError", c != nil, err)
			}
			cl.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := cl.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("client read after failed accept: %v, want EOF (socket shut down)", err)
			}
		})
	}
	if p.devB.Stats().HandshakeErrors != 2 {
		t.Fatalf("handshake errors %d", p.devB.Stats().HandshakeErrors)
	}
}

// TestUpgradeNoAnswer: the port is registered but the server never
// answers: Upgrade fails (its hello is in the stream) and shuts the
// shadow down; a cancelled context fails at once.
func TestUpgradeNoAnswer(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithHandshakeTimeout(100*time.Millisecond))
	ln := registeredListener(t, p.devB)
	cl, sv := shadowPair(t, ln)
	defer cl.Close()
	defer sv.Close()
	c, err := p.dialer.Upgrade(t.Context(), cl)
	var oe *net.OpError
	if err == nil || c != nil || !errors.As(err, &oe) {
		t.Fatalf("Upgrade: conn %v, err %v", c != nil, err)
	}
	got, _ := io.ReadAll(sv) // the client shut its side down after the hello
	if len(got) != wire.HelloLen {
		t.Fatalf("server got %d bytes, want the %d-byte hello", len(got), wire.HelloLen)
	}

	// The address is now cached as not EXT-DS: no second wait.
	cl2, sv2 := shadowPair(t, ln)
	defer cl2.Close()
	defer sv2.Close()
	if c, err := p.dialer.Upgrade(t.Context(), cl2); err != nil || c.Mode() != ModeTCP {
		t.Fatalf("second Upgrade: %v", err)
	} else if r, _ := c.FallbackReason(); r != FallbackCached {
		t.Fatalf("second Upgrade reason %v", r)
	}

	// A cancelled context fails the upgrade (a fresh, registered address).
	ln2 := registeredListener(t, p.devB)
	cl3, sv3 := shadowPair(t, ln2)
	defer cl3.Close()
	defer sv3.Close()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if c, err := p.dialer.Upgrade(ctx, cl3); err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Upgrade with cancelled ctx: conn %v, err %v", c != nil, err)
	}
}
