package exn

// Offload metadata: the meaning of a virtio-net header (the TAP's
// IFF_VNET_HDR, include/uapi/linux/virtio_net.h) carried with a frame, and
// the software fallbacks for a peer that cannot take it.
//
//	frame + Offload from the Link (TAP reader)
//	   │ checkTx: flags, checksum window, GSO headers parsed from the
//	   │          frame itself (hdr_len is only a hint); bad → dropped
//	   │          and counted (tx-offload-malformed)
//	   ├─ peer took the capability (hello, caps.go) and the frame goes
//	   │  by rendezvous: advert with the offload fields (wire.go), the
//	   │  receiver hands frame + Offload to its OffloadLink unchanged
//	   ├─ needs-checksum frame otherwise: completeCsum in place
//	   └─ GSO super-frame otherwise: segment (software GSO) into
//	      MTU-sized frames with full checksums, sent eager
//
// Nothing here keeps state; the functions work on the caller's buffers.

import (
	"encoding/binary"

	"github.com/exn-project/exn/internal/vnet"
)

// Offload is the per-frame meaning of a virtio-net header. Its fields
// match the kernel's struct virtio_net_hdr (and tap.VnetHdr), so the two
// convert into each other.
type Offload struct {
	Flags      uint8  // vnet.NeedsCsum, vnet.DataValid
	GSOType    uint8  // vnet.GSONone, vnet.GSOTCPv4, vnet.GSOTCPv6, vnet.GSOUDPL4, | vnet.GSOECN
	HdrLen     uint16 // length of the headers (a hint; recomputed here)
	GSOSize    uint16 // payload bytes per segment
	CsumStart  uint16 // where the checksummed bytes start
	CsumOffset uint16 // where the checksum goes, from CsumStart
}

// Capability bits a node announces in its hello (caps.go). Zero: frames
// arrive complete, as from an engine without offload.
const (
	CapCsum = 1 << 0 // takes needs-checksum frames
	CapTSO  = 1 << 1 // takes TCP super-frames (vnet.GSOTCPv4, vnet.GSOTCPv6, ECN)
	CapUSO  = 1 << 2 // takes UDP super-frames (vnet.GSOUDPL4)
	capAll  = CapCsum | CapTSO | CapUSO
)

// OffloadLink is a Link that takes frames with their offload metadata
// (exnd's TAP opened with IFF_VNET_HDR). offs[i] belongs to frames[i];
// a zero Offload is a complete frame. The rules of Link.DeliverFrames
// apply.
type OffloadLink interface {
	Link
	DeliverFramesOffload(frames [][]byte, offs []Offload) error
}

// l4 is what parsing a frame's headers found.
type l4 struct {
	v6      bool
	ipOff   int // start of the IP header
	l4Off   int // start of TCP or UDP
	hdrEnd  int // end of the TCP or UDP header: payload start
	proto   uint8
	ipTotal int // IP packet length from the header
}

const (
	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86DD
	protoTCP      = 6
	protoUDP      = 17
)

// parseL4 parses Ethernet (no VLAN tag), IPv4 (no fragment) or IPv6 (no
// extension header) and a TCP or UDP header. ok is false for anything
// else or anything that does not fit f.
func parseL4(f []byte) (h l4, ok bool) {
	if len(f) < EthHeaderLen {
		return h, false
	}
	h.ipOff = EthHeaderLen
	ip := f[EthHeaderLen:]
	switch binary.BigEndian.Uint16(f[12:14]) {
	case etherTypeIPv4:
		if len(ip) < 20 || ip[0]>>4 != 4 {
			return h, false
		}
		ihl := int(ip[0]&0xF) * 4
		if ihl < 20 || len(ip) < ihl || binary.BigEndian.Uint16(ip[6:8])&0x3FFF != 0 {
			return h, false // short, or a fragment
		}
		h.proto, h.l4Off, h.ipTotal = ip[9], h.ipOff+ihl, int(binary.BigEndian.Uint16(ip[2:4]))
	case etherTypeIPv6:
		if len(ip) < 40 || ip[0]>>4 != 6 {
			return h, false
		}
		h.v6, h.proto, h.l4Off = true, ip[6], h.ipOff+40
		h.ipTotal = 40 + int(binary.BigEndian.Uint16(ip[4:6]))
	default:
		return h, false
	}
	switch h.proto {
	case protoTCP:
		if len(f) < h.l4Off+20 {
			return h, false
		}
		doff := int(f[h.l4Off+12]>>4) * 4
		if doff < 20 || len(f) < h.l4Off+doff {
			return h, false
		}
		h.hdrEnd = h.l4Off + doff
	case protoUDP:
		if len(f) < h.l4Off+8 {
			return h, false
		}
		h.hdrEnd = h.l4Off + 8
	default:
		return h, false
	}
	return h, true
}

// check validates o against its frame f: known flags and GSO types only,
// a checksum window inside the frame, and for a super-frame headers that
// match the GSO type, a checksum window on its TCP or UDP header, a
// payload and a segment size, and an IP length that covers the frame
// exactly. wire is true for metadata from the fabric, which may not
// carry vnet.DataValid (a peer's claim is not trusted as a kernel's).
// maxFrame bounds a frame without GSO. It does not allocate.
func (o *Offload) check(f []byte, maxFrame int, wire bool) bool {
	allowed := uint8(vnet.NeedsCsum | vnet.DataValid)
	if wire {
		allowed = vnet.NeedsCsum
	}
	if o.Flags&^allowed != 0 || o.Flags == vnet.NeedsCsum|vnet.DataValid {
		return false
	}
	if o.Flags&vnet.NeedsCsum != 0 {
		end := int(o.CsumStart) + int(o.CsumOffset) + 2
		if int(o.CsumStart) < EthHeaderLen || end > len(f) {
			return false
		}
	} else if o.CsumStart != 0 || o.CsumOffset != 0 {
		return false
	}
	gso := o.GSOType &^ vnet.GSOECN
	if gso == vnet.GSONone {
		return o.GSOType == vnet.GSONone && o.GSOSize == 0 && len(f) <= maxFrame && int(o.HdrLen) <= len(f)
	}
	if len(f) > vnet.MaxGSOFrame || o.Flags != vnet.NeedsCsum || o.GSOSize == 0 {
		return false
	}
	h, ok := parseL4(f)
	if !ok || h.ipOff+h.ipTotal != len(f) {
		return false
	}
	switch gso {
	case vnet.GSOTCPv4, vnet.GSOTCPv6:
		if h.proto != protoTCP || h.v6 != (gso == vnet.GSOTCPv6) || o.CsumOffset != 16 {
			return false
		}
	case vnet.GSOUDPL4:
		if h.proto != protoUDP || o.GSOType&vnet.GSOECN != 0 || o.CsumOffset != 6 {
			return false
		}
	default:
		return false
	}
	return int(o.CsumStart) == h.l4Off && len(f) > h.hdrEnd && int(o.HdrLen) <= len(f) &&
		h.hdrEnd+int(o.GSOSize) <= maxFrame // a segment fits the MTU
}

// needs is the capability a peer needs to take o as it is.
func (o *Offload) needs() uint8 {
	switch o.GSOType &^ vnet.GSOECN {
	case vnet.GSOTCPv4, vnet.GSOTCPv6:
		return CapCsum | CapTSO
	case vnet.GSOUDPL4:
		return CapCsum | CapUSO
	}
	if o.Flags&vnet.NeedsCsum != 0 {
		return CapCsum
	}
	return 0
}

// pseudoSum is the pseudo-header sum of a TCP or UDP segment of l4len
// bytes (RFC 793, RFC 8200 §8.1).
func pseudoSum(f []byte, h *l4, l4len int) uint32 {
	var sum uint32
	if h.v6 {
		sum = vnet.CsumAdd(0, f[h.ipOff+8:h.ipOff+40])
	} else {
		sum = vnet.CsumAdd(0, f[h.ipOff+12:h.ipOff+20])
	}
	return sum + uint32(h.proto) + uint32(l4len)
}

// segments is how many frames segment makes of a checked super-frame.
func segments(f []byte, o *Offload) int {
	h, _ := parseL4(f)
	pay := len(f) - h.hdrEnd
	return (pay + int(o.GSOSize) - 1) / int(o.GSOSize)
}

// segment is software GSO: it writes segment k of the checked super-frame
// f (offload o) into dst, complete with its own headers and checksums, and
// returns its length. dst must hold the headers plus GSOSize bytes. TCP:
// the sequence number advances by the payload before it, FIN and PSH stay
// on the last segment only, CWR on the first (ECN). UDP (USO): each
// segment is a datagram of its own. IPv4 IDs count up from the
// super-frame's, as the kernel's GSO does. It does not allocate.
func segment(dst, f []byte, o *Offload, k int) int {
	h, _ := parseL4(f)
	mss := int(o.GSOSize)
	pay := f[h.hdrEnd:]
	off := k * mss
	chunk := pay[off:min(off+mss, len(pay))]
	last := off+len(chunk) == len(pay)
	n := copy(dst, f[:h.hdrEnd])
	n += copy(dst[n:], chunk)
	s := dst[:n]
	l4len := n - h.l4Off
	ip := s[h.ipOff:]
	if h.v6 {
		binary.BigEndian.PutUint16(ip[4:6], uint16(n-h.ipOff-40))
	} else {
		binary.BigEndian.PutUint16(ip[2:4], uint16(n-h.ipOff))
		binary.BigEndian.PutUint16(ip[4:6], binary.BigEndian.Uint16(ip[4:6])+uint16(k))
		ip[10], ip[11] = 0, 0
		ihl := h.l4Off - h.ipOff
		binary.BigEndian.PutUint16(ip[10:12], ^vnet.CsumFold(vnet.CsumAdd(0, ip[:ihl])))
	}
	t := s[h.l4Off:]
	var at int
	if h.proto == protoTCP {
		seq := binary.BigEndian.Uint32(t[4:8])
		binary.BigEndian.PutUint32(t[4:8], seq+uint32(off))
		if !last {
			t[13] &^= 0x01 | 0x08 // FIN, PSH
		}
		if k > 0 {
			t[13] &^= 0x80 // CWR
		}
		at = 16
	} else {
		binary.BigEndian.PutUint16(t[4:6], uint16(l4len))
		at = 6
	}
	t[at], t[at+1] = 0, 0
	binary.BigEndian.PutUint16(t[at:], vnet.CsumFold(pseudoSum(s, &h, l4len)))
	vnet.CompleteCsum(s, h.l4Off, at)
	return n
}
