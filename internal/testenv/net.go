package testenv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

// ListenTCP listens on an ephemeral loopback port, failing t if it cannot;
// the listener is closed when t ends.
func ListenTCP(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// DialTCP connects to ln, failing t if it cannot; the connection is
// closed when t ends.
func DialTCP(t testing.TB, ln net.Listener) *net.TCPConn {
	t.Helper()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// FreeAddr returns a loopback address whose port was free a moment ago
// (nobody listens on it, until someone else takes it).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// ServeTCP runs a loopback TCP server for the test's duration and returns
// its address: every accepted connection is passed to handle in its own
// goroutine and closed when handle returns. When t ends the listener is
// closed and the accept loop waited for; handlers still running are not.
func ServeTCP(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := Go(func() { AcceptLoop(ln, func(c net.Conn) { defer c.Close(); handle(c) }) })
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// AcceptLoop accepts connections on l until Accept fails (l closed),
// passing each to handle in its own goroutine; it does not wait for them.
func AcceptLoop(l net.Listener, handle func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go handle(c)
	}
}

// UnixPair returns the two ends of a connected AF_UNIX stream socketpair,
// failing t if it cannot make them; both are closed when t ends.
func UnixPair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(os.NewSyscallError("socketpair", err))
	}
	files := []*os.File{os.NewFile(uintptr(fds[0]), "socketpair-a"), os.NewFile(uintptr(fds[1]), "socketpair-b")}
	var ends [2]*net.UnixConn
	for i, f := range files {
		defer f.Close() // the conns hold dups
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ends[i] = c.(*net.UnixConn)
	}
	return ends[0], ends[1]
}

// Carry writes msg to w, reads len(msg) bytes from r and fails unless
// they are exactly msg: one message across a connection, intact (w and r
// may be one echoing connection).
func Carry(w io.Writer, r io.Reader, msg []byte) error {
	if _, err := w.Write(msg); err != nil {
		return fmt.Errorf("write %q: %w", msg, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(r, got); err != nil {
		return fmt.Errorf("read %q: got %q, %w", msg, got, err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("read %q, want %q", got, msg)
	}
	return nil
}

// EchoSized is the server half of a sized ping-pong: it reads a message
// size (u32, little-endian) from rw, then echoes messages of that size
// back until a read or a write fails.
func EchoSized(rw io.ReadWriter) {
	var l [4]byte
	if _, err := io.ReadFull(rw, l[:]); err != nil {
		return
	}
	buf := make([]byte, binary.LittleEndian.Uint32(l[:]))
	for {
		if _, err := io.ReadFull(rw, buf); err != nil {
			return
		}
		if _, err := rw.Write(buf); err != nil {
			return
		}
	}
}

// ServeKinds serves one connection of a test server whose client sends a
// kind byte first: kind ping is the server half of a sized ping-pong
// (EchoSized; the client starts it with OpenSized), any other kind goes
// to serve. c is closed when that returns, or at once if no kind byte
// comes.
func ServeKinds(c net.Conn, ping byte, serve func(c net.Conn, kind byte)) {
	defer c.Close()
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		return
	}
	if kind[0] == ping {
		EchoSized(c)
		return
	}
	serve(c, kind[0])
}

// OpenSized starts the client half of a sized ping-pong on a ServeKinds
// server: it writes kind ping and the message size (u32, little-endian)
// that EchoSized reads.
func OpenSized(w io.Writer, ping byte, size int) error {
	var hdr [5]byte
	hdr[0] = ping
	binary.LittleEndian.PutUint32(hdr[1:], uint32(size))
	_, err := w.Write(hdr[:])
	return err
}
