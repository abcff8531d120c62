package testenv

import (
	"encoding/binary"
	"io"
	"net"
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
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); handle(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
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
