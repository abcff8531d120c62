package fabnet

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestRawReader: the session reader's raw reads over a real TCP
// connection deliver the bytes in order, honour the read deadline and
// end with io.EOF; a closed connection is an error, not a hang.
func TestRawReader(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(acc)
			return
		}
		acc <- c
	}()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	srv, ok := <-acc
	if !ok {
		t.Fatal("accept failed")
	}
	defer srv.Close()
	rc, err := srv.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	r := newRawReader(rc)
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() { cli.Write(want) }()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("byte %d: %d, want %d", i, got[i], want[i])
		}
	}
	srv.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := r.Read(got[:1]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("past the deadline: %v", err)
	}
	srv.SetReadDeadline(time.Time{})
	cli.Close()
	if n, err := r.Read(got[:1]); n != 0 || err != io.EOF {
		t.Fatalf("after the peer closed: %d, %v; want io.EOF", n, err)
	}
	srv.Close()
	if _, err := r.Read(got[:1]); err == nil {
		t.Fatal("read on a closed connection succeeded")
	}
}
