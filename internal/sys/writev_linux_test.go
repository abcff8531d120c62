package sys

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWritev: slices go out in order with empty ones skipped, a full
// socket is EAGAIN (after a partial write), and too many slices EINVAL.
func TestWritev(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	var w Writev
	if n, err := w.Write(fds[0], [][]byte{[]byte("ab"), nil, []byte("cde"), {}, []byte("f")}); n != 6 || err != nil {
		t.Fatalf("Write = %d, %v; want 6, nil", n, err)
	}
	got := make([]byte, 16)
	if n, err := unix.Read(fds[1], got); err != nil || !bytes.Equal(got[:n], []byte("abcdef")) {
		t.Fatalf("read %q, %v", got[:n], err)
	}
	// Fill the socket: writes shrink to a partial one, then EAGAIN.
	big := bytes.Repeat([]byte{7}, 1<<20)
	total := 0
	for i := 0; ; i++ {
		n, err := w.Write(fds[0], [][]byte{big[:1<<19], big[1<<19:]})
		if errors.Is(err, EAGAIN) {
			break
		}
		if err != nil || i > 1000 {
			t.Fatalf("write %d: %d, %v", i, n, err)
		}
		total += n
	}
	if total == 0 {
		t.Fatal("nothing written before EAGAIN")
	}
	if n, err := w.Write(fds[0], make([][]byte, MaxWritev+1)); n != 0 || err != nil {
		t.Fatalf("all-empty slices: %d, %v", n, err)
	}
	many := make([][]byte, MaxWritev+1)
	for i := range many {
		many[i] = []byte{1}
	}
	if _, err := w.Write(fds[0], many); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("%d slices: %v, want EINVAL", len(many), err)
	}
}

// TestRead: EAGAIN when nothing is queued, the bytes when they are, and
// 0, nil at the end of the stream.
func TestRead(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]) })
	b := make([]byte, 8)
	if n, err := Read(fds[0], b); n != 0 || !errors.Is(err, EAGAIN) {
		t.Fatalf("empty: %d, %v; want EAGAIN", n, err)
	}
	if _, err := unix.Write(fds[1], []byte("hey")); err != nil {
		t.Fatal(err)
	}
	if n, err := Read(fds[0], b); err != nil || string(b[:n]) != "hey" {
		t.Fatalf("read %q, %v", b[:n], err)
	}
	unix.Close(fds[1])
	if n, err := Read(fds[0], b); n != 0 || err != nil {
		t.Fatalf("after the peer closed: %d, %v; want 0, nil", n, err)
	}
}
