package sys

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRawDatagram: SendtoRaw and RecvfromRaw carry a datagram with its
// source between two non-blocking sockets, IPv4, IPv6 and an IPv4
// destination from a dual-stack socket; an empty queue is EAGAIN and a
// short buffer truncates.
func TestRawDatagram(t *testing.T) {
	for _, tc := range []struct{ name, from, to string }{
		{"ipv4", "127.0.0.1:0", "127.0.0.1:0"},
		{"ipv6", "[::1]:0", "[::1]:0"},
		{"ipv4 from dual stack", "[::]:0", "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := net.ListenPacket("udp", tc.from)
			if err != nil {
				t.Skipf("listen %s: %v", tc.from, err)
			}
			defer a.Close()
			b, err := net.ListenPacket("udp", tc.to)
			if err != nil {
				t.Skipf("listen %s: %v", tc.to, err)
			}
			defer b.Close()
			fd := func(c net.PacketConn) (int, bool) {
				rc, _ := c.(*net.UDPConn).SyscallConn()
				var f int
				var v6 bool
				rc.Control(func(u uintptr) { f, v6 = int(u), SockIs6(int(u)) })
				return f, v6
			}
			afd, av6 := fd(a)
			bfd, _ := fd(b)
			to := b.LocalAddr().(*net.UDPAddr).AddrPort()
			to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
			buf := make([]byte, 16)
			if _, _, err := RecvfromRaw(bfd, buf); !errors.Is(err, unix.EAGAIN) {
				t.Fatalf("empty queue: %v, want EAGAIN", err)
			}
			msg := []byte("membership probe!")
			if err := SendtoRaw(afd, av6, msg, to); err != nil {
				t.Fatal(err)
			}
			var n int
			var from netip.AddrPort
			for range 1000 { // the datagram is on loopback: at once, or nearly
				if n, from, err = RecvfromRaw(bfd, buf); !errors.Is(err, unix.EAGAIN) {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			if n != len(buf) || !bytes.Equal(buf, msg[:len(buf)]) {
				t.Errorf("got %q (%d), want %q truncated to %d", buf[:n], n, msg, len(buf))
			}
			if from.Port() != uint16(a.LocalAddr().(*net.UDPAddr).Port) || !from.Addr().IsLoopback() {
				t.Errorf("source %v, want loopback port %d", from, a.LocalAddr().(*net.UDPAddr).Port)
			}
		})
	}
}
