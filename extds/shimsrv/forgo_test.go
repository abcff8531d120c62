package shimsrv

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestForgo: a client whose shim has no room for EXT-DS (shim-connect
// fd_limit) tells the acceptor's node that no claim comes, and the
// server's shim-accept answers TCP (peer_fd_limit) at once, whether the
// word comes before it asks or while it waits, with a direct or a relay
// acceptor: not after the peek and claim timeouts (0.5 s), which would
// make the connection slower than plain TCP. The stream is untouched.
func TestForgo(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	for _, tc := range []struct {
		name   string
		direct bool
		during bool // the acceptor asks first
	}{
		{"relay, word first", false, false},
		{"relay, acceptor waiting", false, true},
		{"direct, word first", true, false},
		{"direct, acceptor waiting", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a, b *node
			var acceptArgs []string
			if tc.direct {
				a, b, _ = newDirectNodes(t)
				acceptArgs = []string{"direct"}
			} else {
				a, b = newNodes(t)
			}
			ln := testenv.ListenTCP(t)
			b.listen(t, ln)
			c := testenv.DialTCP(t, ln)
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			forgo := func() {
				f, err := c.File()
				if err != nil {
					t.Error(err)
					return
				}
				defer f.Close()
				res, out, err := a.call(t, []*os.File{f}, "shim-connect", ArgFDLimit)
				if out != nil {
					out.Close()
				}
				if err != nil || res.Mode != "tcp" || res.Reason != ArgFDLimit {
					t.Errorf("shim-connect fd_limit: %+v, %v", res, err)
				}
			}
			const wordAfter = 50 * time.Millisecond
			said := make(chan struct{})
			if !tc.during {
				forgo()
				close(said)
			} else {
				go func() {
					defer close(said)
					time.Sleep(wordAfter)
					forgo()
				}()
			}
			defer func() { <-said }() // its answer read before the nodes close
			f, err := s.(*net.TCPConn).File()
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, out, err := b.call(t, []*os.File{f}, "shim-accept", acceptArgs...)
			took := time.Since(start)
			f.Close()
			if out != nil {
				out.Close()
			}
			if err != nil || res.Mode != "tcp" || res.Reason != "peer_fd_limit" {
				t.Fatalf("shim-accept: %+v, %v; want tcp, peer_fd_limit", res, err)
			}
			if limit := wordAfter + DefaultPeekTimeout/2; took > limit {
				t.Errorf("shim-accept answered after %v, want within %v (the timeouts are %v)", took, limit, DefaultPeekTimeout+300*time.Millisecond)
			}
			if n := b.srv.Stats().Fallbacks["peer_fd_limit"]; n != 1 {
				t.Errorf("peer_fd_limit fallbacks %d, want 1", n)
			}
			// Plain TCP, nothing written by anyone.
			io.WriteString(c, "ping")
			io.WriteString(s, "pong")
			buf := make([]byte, 4)
			for _, r := range []struct {
				conn net.Conn
				want string
			}{{s, "ping"}, {c, "pong"}} {
				r.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.ReadFull(r.conn, buf); err != nil || string(buf) != r.want {
					t.Fatalf("read %q, %v; want %q", buf, err, r.want)
				}
			}
		})
	}
}
