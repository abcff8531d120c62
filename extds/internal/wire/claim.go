package wire

// Bodies of the out-of-band agreement's messages (extds/internal/agree).
//
// CLAIM and CLAIM_REPLY (tags 0x4E / 0x4F; conn field = the client's
// token):
//
//	CLAIM        sport u16, cport u16, flags u32, client IP [16], server IP [16]   44 bytes
//	CLAIM_REPLY  sport u16, status u8 (1 agreed, 0 declined), reason u8        8 bytes
//
// reason: 1 no listener, 2 late, 3 busy, 4 mismatch; 0x80 | q the port
// is on hold for q more HoldQuantum units (HoldReason).
//
// flags: bit 0 (ClaimFlagDirect), the client can take a direct
// connection; bit 1 (ClaimFlagUpgrade), an upgrade's claim; bit 2
// (ClaimFlagNone, alone), the client stays plain TCP and sends no hello:
// no CLAIM_REPLY; other bits zero. IPs are 16-byte (IPv4 as IPv4-mapped).
//
// The direct agreement (tags 0x52 / 0x53; the header's conn field as
// shown):
//
//	CLAIM_DIRECT  conn = the client's CLAIM token:
//	              sport u16, 0 u16, token u32, ring u32, ID u64        24 bytes
//	COMMIT        conn = the server's token (CLAIM_DIRECT's):
//	              sport u16, status u8 (1 commit, 0 abort), 0 u8        8 bytes
//
// Across hosts (issue #38, docs/direct.md "Across hosts"), where each
// node has its own copy of the buffer and exnd's engine (extds/rdirect)
// joins them, the answer and the commit also name each side's engine
// connection and the fabric address (NLA) of its registered buffer
// (tags 0x54 / 0x55):
//
//	CLAIM_RDIRECT conn = the client's CLAIM token:
//	              sport u16, 0 u16, token u32, ring u32, ID u64, NLA u64   32 bytes
//	COMMIT_R      conn = the server's token (CLAIM_RDIRECT's):
//	              sport u16, 1 u8, 0 u8, ID u64, NLA u64                  24 bytes
//
// ID is the sender's engine connection, NLA its buffer's base. An abort
// is the plain COMMIT with status 0, as for one host.
//
// No locks: every function works on its arguments only.

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Message lengths, header included.
const (
	ClaimLen       = 44
	ClaimRepLen    = 8
	ClaimDirectLen = 24
	CommitLen      = 8
	ClaimRDirLen   = 32
	CommitRLen     = 24
)

// ClaimFlagDirect is the CLAIM flag of a client that can take a direct
// connection.
const ClaimFlagDirect uint32 = 1

// ClaimFlagUpgrade marks the CLAIM of an established connection that
// moves onto a direct one in the background (the shim's upgrade,
// docs/shim.md "Upgrade"; with ClaimFlagDirect): the server keeps it
// longer, and a later CLAIM for the same connection (the client asked
// again) replaces an earlier one that nobody answered.
const ClaimFlagUpgrade uint32 = 2

// ClaimFlagNone, alone, is a client's word that its connection stays
// plain TCP and no hello comes (its shim lacks the descriptors, docs/direct.md
// "Descriptors"): the acceptor, which would wait the peek and claim
// timeouts for one, takes the socket as TCP at once. It is not answered.
const ClaimFlagNone uint32 = 4

// Decline reasons carried in CLAIM_REPLY.
const (
	DeclineNoListener uint8 = 1 // no listener registered for the port
	DeclineLate       uint8 = 2 // the acceptor already went plain TCP
	DeclineBusy       uint8 = 3 // claim table full
	DeclineMismatch   uint8 = 4 // the client IP does not resolve to the sender
	// DeclineHold marks the reason as a hold (low 7 bits: quanta left).
	// Reasons below 0x80 are the other declines.
	DeclineHold uint8 = 0x80
)

const (
	// HoldQuantum is the unit of a hold's remaining time on the wire;
	// with 7 bits, MaxHold.
	HoldQuantum = 16 * time.Millisecond
	// MaxHold is the longest hold the wire can say.
	MaxHold = 127 * HoldQuantum
)

// HoldReason is CLAIM_REPLY's reason for a remaining hold.
func HoldReason(left time.Duration) uint8 {
	return DeclineHold | uint8(min(left/HoldQuantum, 127))
}

// HoldOf decodes a CLAIM_REPLY reason: the hold's remaining time and
// whether the reason is a hold.
func HoldOf(reason uint8) (time.Duration, bool) {
	if reason&DeclineHold == 0 {
		return 0, false
	}
	return time.Duration(reason&^DeclineHold) * HoldQuantum, true
}

// DecodeClaim checks and decodes a CLAIM's body (Msg.Data).
func DecodeClaim(p []byte) (sport, cport uint16, cip, sip netip.Addr, flags uint32, ok bool) {
	if len(p) != ClaimLen-HdrLen {
		return 0, 0, netip.Addr{}, netip.Addr{}, 0, false
	}
	if flags = binary.LittleEndian.Uint32(p[4:]); flags&^(ClaimFlagDirect|ClaimFlagUpgrade) != 0 && flags != ClaimFlagNone {
		return 0, 0, netip.Addr{}, netip.Addr{}, 0, false
	}
	sport, cport = binary.LittleEndian.Uint16(p), binary.LittleEndian.Uint16(p[2:])
	cip = netip.AddrFrom16([16]byte(p[8:24])).Unmap()
	sip = netip.AddrFrom16([16]byte(p[24:40])).Unmap()
	return sport, cport, cip, sip, flags, sport != 0 && cport != 0
}

// EncClaim is the CLAIM of the client's connection local→remote.
func EncClaim(fm *fabric.Message, peer fabric.Addr, token uint32, local, remote netip.AddrPort, flags uint32) {
	putHdr(fm, peer, TagClaim, token, ClaimLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], remote.Port())
	binary.LittleEndian.PutUint16(fm.Data[6:], local.Port())
	binary.LittleEndian.PutUint32(fm.Data[8:], flags)
	c, s := local.Addr().As16(), remote.Addr().As16()
	copy(fm.Data[12:28], c[:])
	copy(fm.Data[28:44], s[:])
}

// EncClaimRep is a CLAIM_REPLY.
func EncClaimRep(fm *fabric.Message, peer fabric.Addr, token uint32, port uint16, status, reason uint8) {
	putHdr(fm, peer, TagClaimRep, token, ClaimRepLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = status, reason
}

// StatusBody decodes the body that CLAIM_REPLY and COMMIT begin with: the
// port, then a status byte that is 0 or 1. ok is false if the message is
// not n bytes long (header included) or the status is anything else.
func StatusBody(m *Msg, n int) (port uint16, status uint8, ok bool) {
	if len(m.Data) != n-HdrLen || m.Data[2] > 1 {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint16(m.Data), m.Data[2], true
}

// DecodeClaimDirect checks and decodes a CLAIM_DIRECT's body.
func DecodeClaimDirect(p []byte) (port uint16, token, ring uint32, id uint64, ok bool) {
	if len(p) != ClaimDirectLen-HdrLen {
		return 0, 0, 0, 0, false
	}
	return directBody(p)
}

// directBody decodes the fields CLAIM_DIRECT and CLAIM_RDIRECT begin with
// (len(p) checked by the caller).
func directBody(p []byte) (port uint16, token, ring uint32, id uint64, ok bool) {
	port = binary.LittleEndian.Uint16(p)
	token = binary.LittleEndian.Uint32(p[4:])
	ring = binary.LittleEndian.Uint32(p[8:])
	id = binary.LittleEndian.Uint64(p[12:])
	return port, token, ring, id, binary.LittleEndian.Uint16(p[2:]) == 0 && port != 0 && token != 0 && ring != 0
}

// EncClaimDirect is the CLAIM_DIRECT answering the CLAIM of ctoken: the
// direct connection's token, ring size and buffer ID.
func EncClaimDirect(fm *fabric.Message, peer fabric.Addr, ctoken uint32, port uint16, token, ring uint32, id uint64) {
	putHdr(fm, peer, TagClaimDirect, ctoken, ClaimDirectLen)
	putDirect(fm, port, token, ring, id)
}

// putDirect writes the fields CLAIM_DIRECT and CLAIM_RDIRECT begin with.
func putDirect(fm *fabric.Message, port uint16, token, ring uint32, id uint64) {
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	binary.LittleEndian.PutUint16(fm.Data[6:], 0)
	binary.LittleEndian.PutUint32(fm.Data[8:], token)
	binary.LittleEndian.PutUint32(fm.Data[12:], ring)
	binary.LittleEndian.PutUint64(fm.Data[16:], id)
}

// EncCommit is a COMMIT (status 1) or its abort (0).
func EncCommit(fm *fabric.Message, peer fabric.Addr, token uint32, port uint16, status uint8) {
	putHdr(fm, peer, TagCommit, token, CommitLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = status, 0
}

// DecodeClaimRDirect checks and decodes a CLAIM_RDIRECT's body.
func DecodeClaimRDirect(p []byte) (port uint16, token, ring uint32, id uint64, nla fabric.NLA, ok bool) {
	if len(p) != ClaimRDirLen-HdrLen {
		return 0, 0, 0, 0, 0, false
	}
	port, token, ring, id, ok = directBody(p)
	nla = fabric.NLA(binary.LittleEndian.Uint64(p[20:]))
	return port, token, ring, id, nla, ok && id != 0 && nla != 0
}

// EncClaimRDirect is the CLAIM_RDIRECT answering the CLAIM of ctoken:
// the token, the ring size, the acceptor's engine connection and its
// buffer's NLA.
func EncClaimRDirect(fm *fabric.Message, peer fabric.Addr, ctoken uint32, port uint16, token, ring uint32, id uint64, nla fabric.NLA) {
	putHdr(fm, peer, TagClaimRDirect, ctoken, ClaimRDirLen)
	putDirect(fm, port, token, ring, id)
	binary.LittleEndian.PutUint64(fm.Data[24:], uint64(nla))
}

// DecodeCommitR checks and decodes a COMMIT_R's body.
func DecodeCommitR(p []byte) (port uint16, id uint64, nla fabric.NLA, ok bool) {
	if len(p) != CommitRLen-HdrLen || p[2] != 1 || p[3] != 0 {
		return 0, 0, 0, false
	}
	port = binary.LittleEndian.Uint16(p)
	id = binary.LittleEndian.Uint64(p[4:])
	nla = fabric.NLA(binary.LittleEndian.Uint64(p[12:]))
	return port, id, nla, port != 0 && id != 0 && nla != 0
}

// EncCommitR is a cross-host COMMIT: the client's engine connection and
// its buffer's NLA.
func EncCommitR(fm *fabric.Message, peer fabric.Addr, token uint32, port uint16, id uint64, nla fabric.NLA) {
	putHdr(fm, peer, TagCommitR, token, CommitRLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = 1, 0
	binary.LittleEndian.PutUint64(fm.Data[8:], id)
	binary.LittleEndian.PutUint64(fm.Data[16:], uint64(nla))
}
