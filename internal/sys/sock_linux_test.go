package sys

import (
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/exn-project/exn/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestSocketpairPeekHangup(t *testing.T) {
	a, b, err := Socketpair("t")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	fa, fb := int(a.Fd()), int(b.Fd())
	buf := make([]byte, 8)
	if _, err := RecvPeek(fb, buf); !IsEAGAIN(err) {
		t.Fatalf("peek on empty socket: %v, want EAGAIN", err)
	}
	if _, err := unix.Write(fa, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ { // peeking does not consume
		if n, err := RecvPeek(fb, buf); err != nil || string(buf[:n]) != "hello" {
			t.Fatalf("peek %d: %q, %v", i, buf[:n], err)
		}
	}
	if hup, err := HungUp(fb); err != nil || hup {
		t.Fatalf("HungUp with live peer: %v, %v", hup, err)
	}
	if err := unix.Shutdown(fa, unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	if hup, _ := HungUp(fb); hup {
		t.Fatal("HungUp after the peer's shutdown(SHUT_WR): want false (half-close)")
	}
	if n, err := unix.Read(fb, buf); n != 5 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	if n, err := RecvPeek(fb, buf); n != 0 || err != nil {
		t.Fatalf("peek at EOF: %d, %v", n, err)
	}
	a.Close()
	if hup, err := HungUp(fb); err != nil || !hup {
		t.Fatalf("HungUp after close: %v, %v", hup, err)
	}
}

func TestNonblockingAndSocketKind(t *testing.T) {
	a, b, err := Socketpair("t")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	fd := int(a.Fd())
	for _, on := range []bool{true, false, true} {
		if err := SetNonblocking(fd, on); err != nil {
			t.Fatal(err)
		}
		if got, err := Nonblocking(fd); err != nil || got != on {
			t.Fatalf("Nonblocking = %v, %v; want %v", got, err, on)
		}
	}
	if tcp, err := IsTCPSocket(fd); err != nil || tcp {
		t.Fatalf("unix socket: IsTCPSocket = %v, %v", tcp, err)
	}
	ln := testenv.ListenTCP(t)
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if tcp, err := IsTCPSocket(int(f.Fd())); err != nil || !tcp {
		t.Fatalf("tcp socket: IsTCPSocket = %v, %v", tcp, err)
	}
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	if _, err := IsTCPSocket(int(r.Fd())); err == nil {
		t.Fatal("IsTCPSocket on a pipe: want ENOTSOCK")
	}
}

func TestProcessAlive(t *testing.T) {
	if !ProcessAlive(os.Getpid()) {
		t.Fatal("self not alive")
	}
	for _, pid := range []int{0, -1} {
		if ProcessAlive(pid) {
			t.Fatalf("ProcessAlive(%d) = true", pid)
		}
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("cannot run true:", err)
	}
	if ProcessAlive(cmd.Process.Pid) { // reaped: gone (pid reuse within the test is not a concern)
		t.Fatalf("reaped child %d alive", cmd.Process.Pid)
	}
}
