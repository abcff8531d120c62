package arp

import (
	"encoding/binary"
	"net/netip"
)

// Wire constants (RFC 826, RFC 8200, RFC 4443, RFC 4861).
const (
	etherHdrLen   = 14
	etherTypeARP  = 0x0806
	etherTypeIPv6 = 0x86DD
	etherTypeVLAN = 0x8100

	arpLen       = 28
	arpHWEther   = 1
	arpProtoIPv4 = 0x0800
	arpRequest   = 1
	arpReply     = 2

	ipv6HdrLen     = 40
	protoICMPv6    = 58
	ndpHopLimit    = 255
	icmpRouterSol  = 133
	icmpRouterAdv  = 134
	icmpNeighSol   = 135
	icmpNeighAdv   = 136
	optSourceLLA   = 1
	optTargetLLA   = 2
	ethernetMACLen = 6
)

// Observe examines one Ethernet frame (without FCS) and learns from it if
// it is ARP or NDP. It neither keeps nor modifies frame, and may be called
// concurrently from any number of goroutines. Frames that are neither ARP
// nor ICMPv6 return at once without allocating; a single 802.1Q tag is
// skipped.
func (t *Table) Observe(frame []byte) {
	if len(frame) < etherHdrLen {
		return
	}
	et := binary.BigEndian.Uint16(frame[12:14])
	off := etherHdrLen
	if et == etherTypeVLAN {
		if len(frame) < etherHdrLen+4 {
			return
		}
		et = binary.BigEndian.Uint16(frame[16:18])
		off += 4
	}
	switch et {
	case etherTypeARP:
		t.c.observed.Add(1)
		t.observeARP(frame[off:])
	case etherTypeIPv6:
		t.observeIPv6(frame[6:12], frame[off:])
	}
}

func (t *Table) observeARP(p []byte) {
	if len(p) < arpLen {
		t.malformed("arp: truncated")
		return
	}
	if binary.BigEndian.Uint16(p[0:2]) != arpHWEther || binary.BigEndian.Uint16(p[2:4]) != arpProtoIPv4 ||
		p[4] != ethernetMACLen || p[5] != 4 {
		t.malformed("arp: not ipv4 over ethernet")
		return
	}
	if op := binary.BigEndian.Uint16(p[6:8]); op != arpRequest && op != arpReply {
		t.malformed("arp: unknown opcode")
		return
	}
	sha := p[8:14]
	spa := netip.AddrFrom4([4]byte(p[14:18]))
	switch {
	case spa.IsUnspecified():
		return // probe (RFC 5227): says nothing about the sender
	case spa.IsMulticast(), spa.IsLoopback(), spa == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		t.malformed("arp: sender ip not unicast")
		return
	}
	t.learn(spa, sha)
}

func (t *Table) observeIPv6(ethSrc, p []byte) {
	// Fast exit for everything but NDP, before any counter is touched.
	if len(p) < ipv6HdrLen+1 || p[6] != protoICMPv6 {
		return
	}
	typ := p[ipv6HdrLen]
	if typ < icmpRouterSol || typ > icmpNeighAdv {
		return
	}
	t.c.observed.Add(1)
	if p[0]>>4 != 6 {
		t.malformed("ndp: ip version not 6")
		return
	}
	plen := int(binary.BigEndian.Uint16(p[4:6]))
	if ipv6HdrLen+plen > len(p) {
		t.malformed("ndp: ipv6 payload length past end of frame")
		return
	}
	if p[7] != ndpHopLimit {
		t.malformed("ndp: hop limit not 255")
		return
	}
	src := netip.AddrFrom16([16]byte(p[8:24]))
	icmp := p[ipv6HdrLen : ipv6HdrLen+plen]
	if len(icmp) < 8 || icmp[1] != 0 {
		t.malformed("ndp: truncated or nonzero code")
		return
	}
	if icmpv6Checksum(p[8:24], p[24:40], icmp) != 0xffff {
		t.malformed("ndp: bad icmpv6 checksum")
		return
	}
	if src.IsMulticast() {
		t.malformed("ndp: multicast source")
		return
	}

	var optOff int
	switch typ {
	case icmpRouterSol:
		optOff = 8
	case icmpRouterAdv:
		optOff = 16
	default: // NS, NA
		optOff = 24
	}
	if len(icmp) < optOff {
		t.malformed("ndp: truncated message")
		return
	}
	sll, tll, ok := ndpOptions(icmp[optOff:])
	if !ok {
		t.malformed("ndp: bad option length")
		return
	}

	switch typ {
	case icmpNeighAdv:
		target := netip.AddrFrom16([16]byte(icmp[8:24]))
		if target.IsMulticast() || target.IsUnspecified() {
			t.malformed("ndp: advertisement for non-unicast target")
			return
		}
		if tll == nil {
			// Linux omits the option answering a unicast solicitation;
			// the advertiser is then the frame's sender.
			tll = ethSrc
		}
		t.learn(target, tll)
	case icmpNeighSol:
		if target := netip.AddrFrom16([16]byte(icmp[8:24])); target.IsMulticast() {
			t.malformed("ndp: solicitation for multicast target")
			return
		}
		fallthrough
	default:
		// NS, RS, RA: the source link-layer option names the IPv6 source.
		// An unspecified source (DAD) teaches nothing.
		if sll != nil && !src.IsUnspecified() {
			t.learn(src, sll)
		}
	}
}

// ndpOptions walks NDP options (RFC 4861 §4.6) and returns the first source
// and target link-layer addresses as views into b. ok is false for an
// option of length zero or one that runs past b.
func ndpOptions(b []byte) (sll, tll []byte, ok bool) {
	for len(b) > 0 {
		if len(b) < 2 {
			return nil, nil, false
		}
		n := int(b[1]) * 8
		if n == 0 || n > len(b) {
			return nil, nil, false
		}
		switch b[0] {
		case optSourceLLA:
			if sll == nil {
				sll = b[2:8]
			}
		case optTargetLLA:
			if tll == nil {
				tll = b[2:8]
			}
		}
		b = b[n:]
	}
	return sll, tll, true
}

// icmpv6Checksum returns the ones-complement sum of the IPv6 pseudo-header
// and msg, checksum field included: 0xffff for a correct message.
func icmpv6Checksum(src, dst, msg []byte) uint16 {
	var s uint64
	s = sum16(s, src)
	s = sum16(s, dst)
	s += uint64(len(msg)) + protoICMPv6
	s = sum16(s, msg)
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func sum16(s uint64, b []byte) uint64 {
	for len(b) >= 8 {
		v := binary.BigEndian.Uint64(b)
		s += v>>48 + v>>32&0xffff + v>>16&0xffff + v&0xffff
		b = b[8:]
	}
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}
