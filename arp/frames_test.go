package arp_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// Frame builders. They are written independently of the parser (the ICMPv6
// checksum comes from golang.org/x/net/icmp), so a parser bug cannot hide
// behind a matching builder bug.

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func ether(dst, src net.HardwareAddr, et uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:14], et)
	return append(b, payload...)
}

var broadcast = mac("ff:ff:ff:ff:ff:ff")

// arpFrame builds an ARP packet over Ethernet, sender and target given.
func arpFrame(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	p := make([]byte, 28)
	binary.BigEndian.PutUint16(p[0:2], 1)
	binary.BigEndian.PutUint16(p[2:4], 0x0800)
	p[4], p[5] = 6, 4
	binary.BigEndian.PutUint16(p[6:8], op)
	copy(p[8:14], sha)
	a := spa.As4()
	copy(p[14:18], a[:])
	copy(p[18:24], tha)
	a = tpa.As4()
	copy(p[24:28], a[:])
	dst := broadcast
	if op == 2 {
		dst = tha
	}
	f := ether(dst, sha, 0x0806, p)
	return append(f, make([]byte, 18)...) // pad to the 60-byte minimum, as a NIC would
}

// whoHas is node1's ARP request (ip1 asks for ip2), the frame most
// tests start from.
func whoHas() []byte { return arpFrame(1, node1, ip1, zeroMAC, ip2) }

// solicit is node1's neighbour solicitation (ll1 asks for ll2, with its
// source link-layer option), the NDP frame most tests start from.
func solicit(tb testing.TB) []byte { return nsFrame(tb, nsBody(ll2, llOpt(1, node1))) }

// nsFrame is a neighbour solicitation from node1 (ll1) to the
// solicited-node address snm with ICMPv6 body body.
func nsFrame(tb testing.TB, body []byte) []byte {
	return ndpFrame(tb, node1, ipv6.ICMPTypeNeighborSolicitation, ll1, snm, body)
}

// withByte returns f with f[i] set to b, to spoil one field of a frame.
func withByte(f []byte, i int, b byte) []byte {
	f[i] = b
	return f
}

func llOpt(typ byte, m net.HardwareAddr) []byte {
	return append([]byte{typ, 1}, m...)
}

// ndpFrame builds an IPv6 NDP frame: body is the ICMPv6 message after the
// 4-byte type/code/checksum header.
func ndpFrame(tb testing.TB, ethSrc net.HardwareAddr, typ ipv6.ICMPType, src, dst netip.Addr, body []byte) []byte {
	tb.Helper()
	m := icmp.Message{Type: typ, Body: &icmp.RawBody{Data: body}}
	msg, err := m.Marshal(icmp.IPv6PseudoHeader(src.AsSlice(), dst.AsSlice()))
	if err != nil {
		tb.Fatalf("marshal icmpv6: %v", err)
	}
	ip := make([]byte, 40, 40+len(msg))
	ip[0] = 6 << 4
	binary.BigEndian.PutUint16(ip[4:6], uint16(len(msg)))
	ip[6] = 58
	ip[7] = 255
	s, d := src.As16(), dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	ip = append(ip, msg...)
	dm := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	return ether(dm, ethSrc, 0x86DD, ip)
}

// ndp is ndpFrame as a frame maker of TestObserve's table (its tb is the
// running case's).
func ndp(ethSrc net.HardwareAddr, typ ipv6.ICMPType, src, dst netip.Addr, body []byte) func(testing.TB) []byte {
	return func(tb testing.TB) []byte { return ndpFrame(tb, ethSrc, typ, src, dst, body) }
}

// nsBody is a Neighbor Solicitation body: 4 reserved bytes, target, options.
func nsBody(target netip.Addr, opts ...[]byte) []byte {
	b := make([]byte, 4, 20)
	a := target.As16()
	b = append(b, a[:]...)
	for _, o := range opts {
		b = append(b, o...)
	}
	return b
}

// naBody is a Neighbor Advertisement body: flags (S|O), target, options.
func naBody(target netip.Addr, opts ...[]byte) []byte {
	b := nsBody(target, opts...)
	b[0] = 0x60
	return b
}

// rsBody is a Router Solicitation body: 4 reserved bytes, options.
func rsBody(opts ...[]byte) []byte {
	b := make([]byte, 4)
	for _, o := range opts {
		b = append(b, o...)
	}
	return b
}

// raBody is a Router Advertisement body: hop limit, flags, lifetime,
// reachable, retrans, options.
func raBody(opts ...[]byte) []byte {
	b := make([]byte, 12)
	b[0] = 64
	binary.BigEndian.PutUint16(b[2:4], 1800)
	for _, o := range opts {
		b = append(b, o...)
	}
	return b
}

// ipv4TCP is a plain IPv4 TCP frame: the common case Observe must skip.
func ipv4TCP(size int) []byte {
	p := make([]byte, size-14)
	p[0] = 0x45
	p[9] = 6
	return ether(mac("2e:87:04:07:00:01"), mac("2e:87:04:07:00:02"), 0x0800, p)
}
