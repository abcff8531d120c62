package extds

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

func readAllTimeout(t testing.TB, c net.Conn, d time.Duration) ([]byte, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	return io.ReadAll(c)
}

func TestGracefulCloseDrains(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.conns(t)
	data := randBytes(300<<10, 1)
	if _, err := c.Write(data[:100]); err != nil { // eager
		t.Fatal(err)
	}
	if _, err := c.Write(data[100:]); err != nil { // ring, then VELO when full
		t.Fatal(err)
	}
	if err := c.Close(); err != nil { // default linger: returns at once
		t.Fatal(err)
	}
	got, err := readAllTimeout(t, s, 5*time.Second)
	if err != nil || string(got) != string(data) {
		t.Fatalf("read %d of %d bytes, err %v", len(got), len(data), err)
	}
	s.Close()
	testenv.Eventually(t, "both sides released", 2*time.Second, func() bool {
		return p.devA.Stats().Active == 0 && p.devB.Stats().Active == 0
	})
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after close: %v, want net.ErrClosed", err)
	}
}

func TestLinger(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tests := []struct {
		name       string
		linger     int
		readAfter  time.Duration // server starts reading after; <0 never
		wantReset  bool
		minBlocked time.Duration
	}{
		{"drained-before-timeout", 2, 300 * time.Millisecond, false, 250 * time.Millisecond},
		{"timeout-resets", 1, -1, true, 900 * time.Millisecond},
		{"abortive", 0, 0, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t)
			c, s := p.conns(t)
			defer s.Close()
			data := randBytes(100<<10, 2)
			if _, err := c.Write(data); err != nil {
				t.Fatal(err)
			}
			if err := c.SetLinger(tc.linger); err != nil {
				t.Fatal(err)
			}
			type res struct {
				b   []byte
				err error
			}
			rc := make(chan res, 1)
			if tc.readAfter >= 0 {
				go func() {
					time.Sleep(tc.readAfter)
					b, err := readAllTimeout(t, s, 5*time.Second)
					rc <- res{b, err}
				}()
			}
			start := time.Now()
			c.Close()
			el := time.Since(start)
			if el < tc.minBlocked || el > tc.minBlocked+time.Second {
				t.Errorf("Close blocked %v, want about %v", el, tc.minBlocked)
			}
			if tc.readAfter < 0 {
				// The RESET is asynchronous, as a TCP RST is: let it land.
				testenv.Eventually(t, "reset received", 2*time.Second, func() bool { return p.devB.Stats().ResetsRecv == 1 })
				_, err := readAllTimeout(t, s, 5*time.Second)
				rc <- res{nil, err}
			}
			r := <-rc
			if tc.wantReset {
				if !errors.Is(r.err, syscall.ECONNRESET) {
					t.Fatalf("server read: %v, want ECONNRESET; client %+v server %+v", r.err, p.devA.Stats(), p.devB.Stats())
				}
			} else if r.err != nil || string(r.b) != string(data) {
				t.Fatalf("server read %d of %d bytes, err %v", len(r.b), len(data), r.err)
			}
		})
	}
}

func TestCloseWriteHalfClose(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t)
	c, s := p.openConns(t)
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write after CloseWrite: %v, want EPIPE", err)
	}
	got, err := readAllTimeout(t, s, 5*time.Second)
	if err != nil || string(got) != "request" {
		t.Fatalf("server got %q, %v", got, err)
	}
	reply := randBytes(50<<10, 3)
	if _, err := s.Write(reply); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	got, err = readAllTimeout(t, c, 5*time.Second)
	if err != nil || string(got) != string(reply) {
		t.Fatalf("client got %d bytes, %v", len(got), err)
	}
}

// TestPeerDeath closes one node's NIC: both ends must fail promptly, idle
// or blocked.
func TestPeerDeath(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithTick(50*time.Millisecond))
	c, s := p.openConns(t)
	errc := make(chan error, 2)
	go func() { _, err := c.Read(make([]byte, 10)); errc <- err }() // idle reader
	go func() { _, err := s.Read(make([]byte, 10)); errc <- err }()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	p.nicB.Close()
	for i := 0; i < 2; i++ {
		err := testenv.Within(t, "a reader after peer death", errc, 3*time.Second)
		if err == nil {
			t.Fatal("read succeeded after peer death")
		}
		t.Logf("%v: %v", time.Since(start), err)
	}
	if _, err := c.Write(make([]byte, 10)); err == nil {
		t.Fatal("write succeeded after peer death")
	}
}

func TestShadowLoss(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	p := newPair(t, WithTick(50*time.Millisecond))
	c, s := p.openConns(t)
	s.shadow.Close() // the peer's socket dies, the fabric does not say so
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v, want ECONNRESET after shadow loss", err)
	}
}

func TestDialRefused(t *testing.T) {
	p := newPair(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = p.dialer.DialConn(t.Context(), "tcp", addr)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial: %v, want ECONNREFUSED", err)
	}
	var oe *net.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("dial error %T is not *net.OpError", err)
	}
}
