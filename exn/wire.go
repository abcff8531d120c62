package exn

// EXT-Eth wire format (VPID 0 to VPID 0). docs/ext-eth-engine.md has the
// full description; this is the reference.
//
// Every VELO message's 8-bit tag says what it is:
//
//	bit 7 = 1   eager fragment
//	            bit 6  F: first fragment of a frame
//	            bit 5  L: last fragment of a frame
//	            bits 4..0 fragment index mod 32 (the first has index 0)
//	bit 7 = 0   control: 0x01 is an advert, 0x02 a refusal, 0x03 a
//	            hello, 0x04 an offload advert, 0x05 a grant, 0x06 and
//	            0x07 push announcements (push.go); every other value is
//	            reserved
//
// Eager fragments carry frame bytes only, no header: a frame of n bytes is
// ceil(n/120) fragments, every one but the last exactly 120 bytes. VELO
// delivers in order per (source, target), so F, L and the index are enough
// to reassemble and to detect a lost, duplicated, reordered or garbled
// fragment (index or length mismatch). A 480-byte frame is four messages.
//
// An advert (16 bytes, little-endian) offers one frame for an RMA GET:
//
//	0..7   NLA of the frame in the sender's registered transmit memory
//	8..11  frame length, EthHeaderLen..receiver's max frame
//	12..13 advert sequence number, per (sender, receiver), +1 per advert
//	14..15 reserved, zero
//
// A refusal (tag 0x02, same 16-byte layout) sends an advert back: the
// receiver dropped it (its per-source queue was full) and will never pull
// it, so the sender frees the slot at once instead of waiting for
// AdvertTimeout. The sender accepts a refusal only from the node the slot
// was advertised to, for the exact NLA and length.
//
// A hello (tag 0x03, at least 3 bytes) announces offload capability
// (caps.go): byte 0 the version (1), byte 1 the capability bits (CapCsum,
// CapTSO, CapUSO; unknown bits ignored), byte 2 flags (bit 0: answer with
// your hello; bit 1: I push into grants, push.go).
//
// A grant (tag 0x05, 12..116 bytes): the receiver's incarnation (4
// bytes), then 1..14 NLAs (8 bytes each) of its rx buffers' frames that
// the source may PUT into, push header in front. A push announcement
// (tag 0x06, 20 bytes; 0x07, 30 bytes) is an advert (offload advert) whose
// NLA is the granted buffer's, followed by the push's 4-byte stamp; the
// receiver takes the frame from its own buffer once the push header
// written by the same PUT matches (push.go). An engine that predates hellos drops it as bad-tag and so
// stays a peer without offload.
//
// An offload advert (tag 0x04, 26 bytes) is an advert (bytes 0..15, same
// meaning and checks, but a super-frame may be up to vnet.MaxGSOFrame long)
// followed by the frame's virtio-net header meaning (offload.go), little-
// endian: 16 flags (only vnet.NeedsCsum may be set), 17 GSO type,
// 18..19 header length, 20..21 GSO segment size, 22..23 checksum start,
// 24..25 checksum offset. It goes only to a peer whose hello announced
// the capability the frame needs; the receiver checks the fields against
// the frame once it has pulled it, and drops a mismatch
// (offload-malformed). A refusal of it is the plain 16-byte refusal.
//
// The receiver GETs exactly [NLA, NLA+length) into a receive buffer with
// NotifyCompleter|NotifyResponder; the sender frees its slot on the
// responder notification, matched by fabric.LastFrame (§5.4.2).

import (
	"encoding/binary"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/vnet"
)

const (
	tagEager   fabric.Tag = 0x80
	tagFirst   fabric.Tag = 0x40
	tagLast    fabric.Tag = 0x20
	tagIdxMask fabric.Tag = 0x1F
	tagAdvert  fabric.Tag = 0x01
	tagRefuse  fabric.Tag = 0x02
	tagHello   fabric.Tag = 0x03
	tagAdvertX fabric.Tag = 0x04
	tagGrant   fabric.Tag = 0x05 // push.go
	tagPushed  fabric.Tag = 0x06
	tagPushedX fabric.Tag = 0x07

	advertLen  = 16
	advertXLen = 26
	stampLen   = 4 // a push announcement's stamp, after the advert layout
	grantHdr   = 4 // a grant's incarnation, before its NLAs
	fragLen    = fabric.MaxVELOPayload
)

// advert is a decoded advert payload.
type advert struct {
	nla   fabric.NLA
	len   uint32
	seq   uint16
	off   Offload // offload advert only
	stamp uint32  // push announcement only
}

// encodePushed writes a push announcement: the advert layout (offload:
// x) with the receiver buffer's NLA, then the stamp. It returns the
// length.
func (a *advert) encodePushed(b []byte, x bool) uint8 {
	n := advertLen
	if x {
		a.encodeX(b)
		n = advertXLen
	} else {
		a.encode(b)
	}
	binary.LittleEndian.PutUint32(b[n:], a.stamp)
	return uint8(n + stampLen)
}

// decodePushed parses a push announcement (offload: x): the advert
// checks, then the stamp.
func decodePushed(p []byte, maxFrame int, x bool) (advert, DropReason) {
	n := advertLen
	if x {
		n = advertXLen
	}
	if len(p) != n+stampLen {
		return advert{}, DropPushForged
	}
	var a advert
	var reason DropReason
	if x {
		a, reason = decodeAdvertX(p[:n], maxFrame)
	} else {
		a, reason = decodeAdvert(p[:n], maxFrame)
	}
	a.stamp = binary.LittleEndian.Uint32(p[n:])
	return a, reason
}

// decodeGrant parses a grant: the receiver's incarnation and 1 to
// maxGrantNLAs buffer NLAs (8 bytes each, little-endian), each in a
// region other than 0 and at least pushHdrLen into it (the header goes
// in front). nlas is the NLAs' bytes.
func decodeGrant(p []byte) (inc uint32, nlas []byte, ok bool) {
	k := (len(p) - grantHdr) / 8
	if len(p) < grantHdr+8 || (len(p)-grantHdr)%8 != 0 || k > maxGrantNLAs {
		return 0, nil, false
	}
	nlas = p[grantHdr:]
	for i := range k {
		a := fabric.NLA(binary.LittleEndian.Uint64(nlas[8*i:]))
		if a.Region() == 0 || a.Offset() < pushHdrLen {
			return 0, nil, false
		}
	}
	return binary.LittleEndian.Uint32(p), nlas, true
}

// encodeX writes an offload advert (advertXLen bytes).
func (a *advert) encodeX(b []byte) {
	a.encode(b)
	o := &a.off
	b[16], b[17] = o.Flags, o.GSOType
	binary.LittleEndian.PutUint16(b[18:20], o.HdrLen)
	binary.LittleEndian.PutUint16(b[20:22], o.GSOSize)
	binary.LittleEndian.PutUint16(b[22:24], o.CsumStart)
	binary.LittleEndian.PutUint16(b[24:26], o.CsumOffset)
}

// decodeAdvertX parses an offload advert. The fields are checked against
// the frame once it is pulled (Offload.check); here only the shape and
// the length: up to maxFrame, or vnet.MaxGSOFrame for a super-frame.
func decodeAdvertX(p []byte, maxFrame int) (advert, DropReason) {
	if len(p) != advertXLen {
		return advert{}, DropOffloadForged
	}
	o := Offload{
		Flags: p[16], GSOType: p[17],
		HdrLen:     binary.LittleEndian.Uint16(p[18:20]),
		GSOSize:    binary.LittleEndian.Uint16(p[20:22]),
		CsumStart:  binary.LittleEndian.Uint16(p[22:24]),
		CsumOffset: binary.LittleEndian.Uint16(p[24:26]),
	}
	if o.GSOType != vnet.GSONone {
		maxFrame = max(maxFrame, vnet.MaxGSOFrame)
	}
	a, reason := decodeAdvert(p[:advertLen], maxFrame)
	a.off = o
	return a, reason
}

func (a *advert) encode(b []byte) {
	binary.LittleEndian.PutUint64(b[0:8], uint64(a.nla))
	binary.LittleEndian.PutUint32(b[8:12], a.len)
	binary.LittleEndian.PutUint16(b[12:14], a.seq)
	b[14], b[15] = 0, 0
}

// decodeAdvert parses an advert payload for a receiver whose largest frame
// is maxFrame. It checks the shape only; whether the NLA is really the
// sender's memory is checked by the fabric (an error notification).
func decodeAdvert(p []byte, maxFrame int) (advert, DropReason) {
	if len(p) != advertLen || p[14] != 0 || p[15] != 0 {
		return advert{}, DropAdvertMalformed
	}
	a := advert{
		nla: fabric.NLA(binary.LittleEndian.Uint64(p[0:8])),
		len: binary.LittleEndian.Uint32(p[8:12]),
		seq: binary.LittleEndian.Uint16(p[12:14]),
	}
	if a.nla.Region() == 0 {
		return advert{}, DropAdvertMalformed
	}
	if a.len < EthHeaderLen || a.len > uint32(maxFrame) {
		return advert{}, DropAdvertLength
	}
	return a, DropNone
}

// numFragments is how many eager fragments a frame of n bytes takes.
func numFragments(n int) int { return (n + fragLen - 1) / fragLen }

// putFragments writes frame as eager fragments into msgs (which must hold
// numFragments(len(frame)) entries) addressed to peer.
func putFragments(msgs []fabric.Message, frame []byte, peer fabric.Addr, mc bool) {
	for i := 0; len(frame) > 0; i++ {
		m := &msgs[i]
		tag := tagEager | fabric.Tag(i)&tagIdxMask
		if i == 0 {
			tag |= tagFirst
		}
		k := copy(m.Data[:], frame)
		frame = frame[k:]
		if len(frame) == 0 {
			tag |= tagLast
		}
		m.Peer, m.MC, m.Tag, m.Len = peer, mc, tag, uint8(k)
	}
}

// isGroupMAC reports whether mac is multicast or broadcast (the I/G bit).
func isGroupMAC(mac []byte) bool { return mac[0]&1 != 0 }
