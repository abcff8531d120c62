package testenv

import (
	"io"
	"net"
	"testing"
)

// TestServeKinds: a sized ping-pong opened with OpenSized is echoed
// (EchoSized), another kind reaches serve with the rest of the stream,
// and the connection is closed after either.
func TestServeKinds(t *testing.T) {
	const ping, other = 'P', 'X'
	addr := ServeTCP(t, func(c net.Conn) {
		ServeKinds(c, ping, func(c net.Conn, kind byte) {
			if kind == other {
				io.Copy(c, c)
			}
		})
	})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	c := dial()
	if err := OpenSized(c, ping, 3); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"abc", "def"} {
		if err := Carry(c, c, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}

	c = dial()
	if _, err := c.Write([]byte{other}); err != nil {
		t.Fatal(err)
	}
	if err := Carry(c, c, []byte("rest")); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Fatalf("after the echo: %q, %v", b, err)
	}
}
