package sys

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLookupTCP: a connection is found by its 4-tuple from either side,
// not accepted while it waits in the accept queue and accepted after
// accept; its last ACK is recent; a 4-tuple with no connection is not
// found. Run for IPv4 and, where the host has it, IPv6 loopback.
func TestLookupTCP(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "tcp6" {
				addr = "[::1]:0"
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Skipf("no %s loopback: %v", network, err)
			}
			defer ln.Close()
			cl, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			server := ln.Addr().(*net.TCPAddr).AddrPort()
			client := cl.LocalAddr().(*net.TCPAddr).AddrPort()
			info, ok, err := LookupTCP(server, client)
			if err != nil || !ok || info.Accepted {
				t.Fatalf("in the accept queue: %+v, found %v, %v; want found, not accepted", info, ok, err)
			}
			if info.SinceLastAck > time.Second {
				t.Fatalf("a connection made now has its last ACK %v ago", info.SinceLastAck)
			}
			sv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer sv.Close()
			if info, ok, err := LookupTCP(server, client); err != nil || !ok || !info.Accepted {
				t.Fatalf("accepted: %+v, found %v, %v; want found, accepted", info, ok, err)
			}
			if info, ok, err := LookupTCP(client, server); err != nil || !ok || !info.Accepted {
				t.Fatalf("the client's side: %+v, found %v, %v; want found, accepted", info, ok, err)
			}
			time.Sleep(50 * time.Millisecond)
			if info, _, _ := LookupTCP(server, client); info.SinceLastAck < 20*time.Millisecond {
				t.Fatalf("50 ms after the handshake its last ACK is %v old", info.SinceLastAck)
			}
			other := netip.AddrPortFrom(client.Addr(), client.Port()+1)
			if client.Port() == 65535 {
				other = netip.AddrPortFrom(client.Addr(), 1)
			}
			if _, ok, err := LookupTCP(server, other); ok || err != nil {
				t.Fatalf("no such connection: found %v, %v", ok, err)
			}
		})
	}
	if _, _, err := LookupTCP(netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("[::1]:1")); err == nil {
		t.Fatal("mixed families: no error")
	}
}

// TestParseDiagAnswer: malformed answers are errors, never a panic or a
// found connection.
func TestParseDiagAnswer(t *testing.T) {
	ne := binary.NativeEndian
	msg := func(typ uint16, body []byte) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN+len(body))
		ne.PutUint32(b, uint32(len(b)))
		ne.PutUint16(b[4:], typ)
		copy(b[unix.NLMSG_HDRLEN:], body)
		return b
	}
	attr := func(typ uint16, n int) []byte {
		a := make([]byte, (unix.SizeofRtAttr+n+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1))
		ne.PutUint16(a, uint16(unix.SizeofRtAttr+n))
		ne.PutUint16(a[2:], typ)
		return a
	}
	const lport, rport = 5001, 40000
	good := make([]byte, diagMsgLen)
	good[diagStateOff] = 1 // ESTABLISHED
	binary.BigEndian.PutUint16(good[diagIDOff:], lport)
	binary.BigEndian.PutUint16(good[diagIDOff+2:], rport)
	listening := append([]byte{}, good...)
	listening[diagStateOff] = tcpListen
	otherPort := append([]byte{}, good...)
	binary.BigEndian.PutUint16(otherPort[diagIDOff+2:], 0)
	ne.PutUint32(good[diagInodeOff:], 7)
	ti := attr(diagAttrInfo, lastAckOff+4)
	ne.PutUint32(ti[unix.SizeofRtAttr+lastAckOff:], 12)
	enoent := make([]byte, 4)
	neg := func(e unix.Errno) uint32 { return uint32(-int32(e)) }
	ne.PutUint32(enoent, neg(unix.ENOENT))
	eperm := make([]byte, 4)
	ne.PutUint32(eperm, neg(unix.EPERM))
	for _, tc := range []struct {
		name    string
		b       []byte
		ok, err bool
	}{
		{"good", msg(unix.SOCK_DIAG_BY_FAMILY, append(append(append([]byte{}, good...), attr(5, 1)...), ti...)), true, false},
		{"enoent", msg(unix.NLMSG_ERROR, enoent), false, false},
		{"eperm", msg(unix.NLMSG_ERROR, eperm), false, true},
		{"short", []byte{1, 2, 3}, false, true},
		{"length past the end", func() []byte { b := msg(unix.SOCK_DIAG_BY_FAMILY, good); ne.PutUint32(b, 1000); return b }(), false, true},
		{"short msg", msg(unix.SOCK_DIAG_BY_FAMILY, good[:10]), false, true},
		{"no info", msg(unix.SOCK_DIAG_BY_FAMILY, good), false, true},
		{"short info", msg(unix.SOCK_DIAG_BY_FAMILY, append(append([]byte{}, good...), attr(diagAttrInfo, 8)...)), false, true},
		{"zero attribute", msg(unix.SOCK_DIAG_BY_FAMILY, append(append([]byte{}, good...), 0, 0, 0, 0)), false, true},
		{"other type", msg(99, good), false, true},
		{"the listener", msg(unix.SOCK_DIAG_BY_FAMILY, append(append([]byte{}, listening...), ti...)), false, false},
		{"other ports", msg(unix.SOCK_DIAG_BY_FAMILY, append(append([]byte{}, otherPort...), ti...)), false, false},
	} {
		info, ok, err := parseDiagAnswer(tc.b, lport, rport)
		if ok != tc.ok || (err != nil) != tc.err {
			t.Errorf("%s: %+v found %v, %v; want found %v, error %v", tc.name, info, ok, err, tc.ok, tc.err)
		}
		if tc.name == "good" && (!info.Accepted || info.SinceLastAck != 12*time.Millisecond) {
			t.Errorf("good: %+v, want accepted, 12ms", info)
		}
	}
}

func FuzzParseDiagAnswer(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, unix.NLMSG_HDRLEN+diagMsgLen+8))
	f.Fuzz(func(t *testing.T, b []byte) {
		info, ok, err := parseDiagAnswer(b, 5001, 40000)
		if ok && err != nil || !ok && info != (TCPConnInfo{}) {
			t.Fatalf("%+v %v %v", info, ok, err)
		}
	})
}
