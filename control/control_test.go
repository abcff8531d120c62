package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

func startServer(t testing.TB) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "exnd.sock")
	s := NewServer(nil)
	s.Handle("echo", func(_ context.Context, args []string) (any, error) { return args, nil })
	s.Handle("fail", func(context.Context, []string) (any, error) { return nil, errors.New("it failed") })
	s.Handle("block", func(ctx context.Context, _ []string) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	if err := s.Listen(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// dialServer connects a client to the server at path, failing t if it
// cannot; the client is closed when t ends.
func dialServer(t testing.TB, path string) *Client {
	t.Helper()
	c, err := Dial(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestCalls(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	_, path := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := dialServer(t, path)

	tests := []struct {
		op      string
		args    []string
		want    []string
		wantErr string
	}{
		{op: "echo", args: []string{"a", "b"}, want: []string{"a", "b"}},
		{op: "ECHO", args: []string{"x"}, want: []string{"x"}},
		{op: "fail", wantErr: "it failed"},
		{op: "nosuch", wantErr: `unknown operation "nosuch"`},
		{op: "echo", args: []string{"after", "errors"}, want: []string{"after", "errors"}},
	}
	for _, tt := range tests {
		var got []string
		err := c.Call(ctx, &got, tt.op, tt.args...)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: err = %v, want %q", tt.op, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != strings.Join(tt.want, ",") {
			t.Errorf("%s: got %v, %v; want %v", tt.op, got, err, tt.want)
		}
	}
}

func TestOverlongLineAndGarbage(t *testing.T) {
	_, path := startServer(t)
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte(strings.Repeat("x", MaxLine+10) + "\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	n, _ := conn.Read(buf)
	if !strings.Contains(string(buf[:n]), `"ok":false`) {
		t.Fatalf("over-long line: got %q, want an error response", buf[:n])
	}
	// The server is still alive for new clients.
	c := dialServer(t, path)
	if err := c.Call(context.Background(), nil, "echo"); err != nil {
		t.Fatalf("server unusable after bad client: %v", err)
	}
}

func TestCloseUnblocksHandlersAndRemovesSocket(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	s, path := startServer(t)
	c := dialServer(t, path)
	errc := make(chan error, 1)
	go func() { errc <- c.Call(context.Background(), nil, "block") }()
	time.Sleep(50 * time.Millisecond)
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	testenv.Within(t, "Close with a blocked handler", done, 5*time.Second)
	if err := <-errc; err == nil {
		t.Fatal("blocked call returned no error after Close")
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Fatal("socket still accepts after Close")
	}
}

func TestSecondServerRefused(t *testing.T) {
	_, path := startServer(t)
	s2 := NewServer(nil)
	if err := s2.Listen(path); err == nil {
		s2.Close()
		t.Fatal("second server took a live socket")
	}
}

// TestFilePassing: a request carries descriptors in, and a response
// carries one out, as the LD_PRELOAD shim uses them.
func TestFilePassing(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	testenv.VerifyNoFDLeaks(t)
	s, path := startServer(t)
	s.HandleFD("relay", func(_ context.Context, req *Request) (any, []*os.File, error) {
		if len(req.Files) != 1 {
			return nil, nil, fmt.Errorf("want 1 fd, got %d", len(req.Files))
		}
		if _, err := req.Files[0].Write([]byte("from server")); err != nil {
			return nil, nil, err
		}
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil, err
		}
		w.Write([]byte("returned pipe"))
		w.Close()
		return "done", []*os.File{r}, nil
	})
	c := dialServer(t, path)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var reply string
	f, err := c.CallFD(context.Background(), &reply, []*os.File{w}, "relay")
	w.Close()
	if err != nil || f == nil || reply != "done" {
		t.Fatalf("CallFD: %q, %v, %v", reply, f, err)
	}
	defer f.Close()
	got, _ := io.ReadAll(f)
	if string(got) != "returned pipe" {
		t.Errorf("returned fd carried %q", got)
	}
	buf := make([]byte, 64)
	n, _ := r.Read(buf)
	if string(buf[:n]) != "from server" {
		t.Errorf("passed fd carried %q", buf[:n])
	}
	// Too many descriptors: refused with an error, nothing leaks.
	var many []*os.File
	for range MaxFDs + 1 {
		many = append(many, r)
	}
	if _, err := c.CallFD(context.Background(), nil, many, "relay"); err == nil {
		t.Error("request with too many fds accepted")
	}
	// A plain handler ignores and closes passed descriptors.
	c2 := dialServer(t, path)
	if _, err := c2.CallFD(context.Background(), nil, []*os.File{r}, "echo", "x"); err != nil {
		t.Errorf("echo with an fd: %v", err)
	}
}
