package control

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
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
		srv, cli := testenv.UnixPair(t)
		done := testenv.Go(func() { s.ServeConn(context.Background(), srv) })
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
