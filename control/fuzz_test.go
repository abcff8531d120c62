package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/sys"
)

// FuzzServe feeds arbitrary bytes to the request decoder (framing, line
// limit, field splitting, dispatch) over one connection: every answer is
// one well-formed response line, the connection ends, nothing panics.
func FuzzServe(f *testing.F) {
	for _, s := range []string{"status\n", "shim-hello 2\n\n", "x \x00\xff y\n", "", "no newline", string(make([]byte, MaxLine+10)) + "\n", "a\nb\nc\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s := NewServer(nil)
		s.SetLimits(0, 200*time.Millisecond)
		s.Handle("status", func(context.Context, []string) (any, error) { return map[string]int{"n": 1}, nil })
		a, b, err := sys.Socketpair("fuzz")
		if err != nil {
			t.Fatal(err)
		}
		srvc, err1 := net.FileConn(a)
		clic, err2 := net.FileConn(b)
		a.Close()
		b.Close()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		srv, cli := srvc.(*net.UnixConn), clic.(*net.UnixConn)
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.ServeConn(context.Background(), srv)
		}()
		go func() {
			_, _ = cli.Write(in)
			_ = cli.CloseWrite()
		}()
		r := bufio.NewReader(cli)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				var resp Response
				if jerr := json.Unmarshal(line, &resp); jerr != nil {
					t.Fatalf("bad response line %q: %v", line, jerr)
				}
			}
			if err != nil {
				// ECONNRESET: the server dropped a connection that had
				// sent more than it read (an over-long line).
				if err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("read: %v", err)
				}
				break
			}
		}
		<-done
		cli.Close()
		s.Close()
	})
}
