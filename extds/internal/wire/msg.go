package wire

// Fabric messages: tags, the decoder and the encoders (doc.go has the
// table). No locks: every function works on its arguments only.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/exn-project/exn/fabric"
)

// VELO user tags (Table 5.3, plus RESET and the ZCopy messages). They
// start at 0x40 so a stray EXT-Eth message (which uses low tags) is never
// mistaken for one.
const (
	TagVELO     fabric.Tag = 0x40
	TagVELOLast fabric.Tag = 0x41
	TagRMAInfo  fabric.Tag = 0x42
	TagRMAAvail fabric.Tag = 0x43
	TagShutdown fabric.Tag = 0x44
	TagReset    fabric.Tag = 0x45
	TagZCSrc    fabric.Tag = 0x46
	TagZCWant   fabric.Tag = 0x47
	TagZCSink   fabric.Tag = 0x48
	TagZCPut    fabric.Tag = 0x49
	TagZCDone   fabric.Tag = 0x4A
	TagNoConn   fabric.Tag = 0x4B
	TagProbe    fabric.Tag = 0x4C
	TagProbeRep fabric.Tag = 0x4D
	// The out-of-band agreement (after PROBE_REPLY; claim.go).
	TagClaim    fabric.Tag = 0x4E
	TagClaimRep fabric.Tag = 0x4F
	// The direct agreement. 0x50 and 0x51 are fabric/fping's.
	TagClaimDirect fabric.Tag = 0x52
	TagCommit      fabric.Tag = 0x53
	// The cross-host direct agreement (issue #38; claim.go).
	TagClaimRDirect fabric.Tag = 0x54
	TagCommitR      fabric.Tag = 0x55
	tagLast                    = TagCommitR
)

const (
	// HdrLen is the connection ID that starts every payload.
	HdrLen = 4
	// FragData is the user data one VELO fragment carries: the 120-byte
	// payload less the connection ID.
	FragData = fabric.MaxVELOPayload - HdrLen
)

// ErrProtocol marks a peer that broke the EXT-DS protocol (a malformed
// message, a credit overflow, an RMA_INFO outside the ring). The
// connection is reset.
var ErrProtocol = errors.New("extds: protocol violation")

// Msg is a decoded fabric message. Data aliases the fabric.Message
// payload: decoding allocates nothing.
type Msg struct {
	Tag  fabric.Tag
	Conn uint32
	A, B uint32 // offset/length, ring/eager credits, or length
	NLA  fabric.NLA
	Data []byte
}

var wantLen = [...]int{
	TagRMAInfo - TagVELO:  12,
	TagRMAAvail - TagVELO: 12,
	TagShutdown - TagVELO: 4,
	TagReset - TagVELO:    4,
	TagZCSrc - TagVELO:    16,
	TagZCWant - TagVELO:   8,
	TagZCSink - TagVELO:   16,
	TagZCPut - TagVELO:    8,
	TagZCDone - TagVELO:   4,
	TagNoConn - TagVELO:   4,
	TagProbe - TagVELO:    8,
	TagProbeRep - TagVELO: 8,
	TagClaim - TagVELO:    ClaimLen,
	TagClaimRep - TagVELO: ClaimRepLen,
	// 0x50, 0x51: fabric/fping's tags, not EXT-DS's (0: unknown).
	TagClaimDirect - TagVELO:  ClaimDirectLen,
	TagCommit - TagVELO:       CommitLen,
	TagClaimRDirect - TagVELO: ClaimRDirLen,
	TagCommitR - TagVELO:      CommitRLen,
}

// Decode parses one fabric message's payload. It rejects unknown tags,
// wrong lengths, a zero connection ID, empty data fragments and zero
// lengths, with ErrProtocol.
func Decode(tag fabric.Tag, p []byte, m *Msg) error {
	if tag < TagVELO || tag > tagLast || tag > TagVELOLast && wantLen[tag-TagVELO] == 0 {
		return errBadTag
	}
	if len(p) < HdrLen {
		return errShort
	}
	*m = Msg{Tag: tag, Conn: binary.LittleEndian.Uint32(p)}
	if m.Conn == 0 {
		return errZeroConn
	}
	switch tag {
	case TagVELO, TagVELOLast:
		if len(p) == HdrLen {
			return errEmpty
		}
		m.Data = p[HdrLen:]
		return nil
	}
	if len(p) != wantLen[tag-TagVELO] {
		return errLength
	}
	switch tag {
	case TagRMAInfo, TagRMAAvail:
		m.A = binary.LittleEndian.Uint32(p[4:])
		m.B = binary.LittleEndian.Uint32(p[8:])
		if tag == TagRMAInfo && m.B == 0 || tag == TagRMAAvail && m.A == 0 && m.B == 0 {
			return errZeroLen
		}
	case TagZCSrc, TagZCSink:
		m.NLA = fabric.NLA(binary.LittleEndian.Uint64(p[4:]))
		m.B = binary.LittleEndian.Uint32(p[12:])
		if m.B == 0 || m.NLA == 0 {
			return errZeroLen
		}
	case TagClaim, TagClaimRep, TagClaimDirect, TagCommit, TagClaimRDirect, TagCommitR:
		m.Data = p[HdrLen:] // claim.go's decoders check the rest
	case TagZCWant, TagZCPut:
		m.B = binary.LittleEndian.Uint32(p[4:])
		if m.B == 0 {
			return errZeroLen
		}
	case TagProbe, TagProbeRep:
		m.A = uint32(binary.LittleEndian.Uint16(p[4:]))
		m.B = uint32(p[6])
		switch {
		case p[7] != 0:
			return errReserved
		case m.A == 0:
			return errZeroLen
		case tag == TagProbe && m.B != 0 || m.B > 1:
			return errBadStatus
		}
	}
	return nil
}

var (
	errBadTag    = fmt.Errorf("unknown tag: %w", ErrProtocol)
	errShort     = fmt.Errorf("short message: %w", ErrProtocol)
	errZeroConn  = fmt.Errorf("connection id 0: %w", ErrProtocol)
	errEmpty     = fmt.Errorf("empty data fragment: %w", ErrProtocol)
	errLength    = fmt.Errorf("bad length for tag: %w", ErrProtocol)
	errZeroLen   = fmt.Errorf("zero length or address: %w", ErrProtocol)
	errReserved  = fmt.Errorf("reserved byte set: %w", ErrProtocol)
	errBadStatus = fmt.Errorf("bad probe status: %w", ErrProtocol)
)

// The encoders fill a fabric.Message in place.

func putHdr(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn uint32, n int) {
	fm.Peer = peer
	fm.MC = false
	fm.Tag = tag
	fm.Len = uint8(n)
	binary.LittleEndian.PutUint32(fm.Data[:], conn)
}

// EncData is a VELO (VELO_LAST if last) fragment of data, at most
// FragData bytes of it.
func EncData(fm *fabric.Message, peer fabric.Addr, conn uint32, last bool, data []byte) {
	tag := TagVELO
	if last {
		tag = TagVELOLast
	}
	n := copy(fm.Data[HdrLen:], data)
	putHdr(fm, peer, tag, conn, HdrLen+n)
}

// EncTwo is RMA_INFO or RMA_AVAIL.
func EncTwo(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn, a, b uint32) {
	putHdr(fm, peer, tag, conn, 12)
	binary.LittleEndian.PutUint32(fm.Data[4:], a)
	binary.LittleEndian.PutUint32(fm.Data[8:], b)
}

// EncCtl is a message of the conn ID alone (SHUTDOWN, RESET, ZC_DONE,
// NOCONN).
func EncCtl(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn uint32) {
	putHdr(fm, peer, tag, conn, HdrLen)
}

// EncLen is ZC_WANT or ZC_PUT.
func EncLen(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn, n uint32) {
	putHdr(fm, peer, tag, conn, 8)
	binary.LittleEndian.PutUint32(fm.Data[4:], n)
}

// EncProbe is PROBE or PROBE_REPLY.
func EncProbe(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, token uint32, port uint16, status uint8) {
	putHdr(fm, peer, tag, token, 8)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = status, 0
}

// EncNLA is ZC_SRC or ZC_SINK.
func EncNLA(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn uint32, nla fabric.NLA, n uint32) {
	putHdr(fm, peer, tag, conn, 16)
	binary.LittleEndian.PutUint64(fm.Data[4:], uint64(nla))
	binary.LittleEndian.PutUint32(fm.Data[12:], n)
}

// Ctl is a short message a Device sends later, from its control sender:
// RESET, NOCONN, or an answer of the agreement (PROBE_REPLY, CLAIM_REPLY,
// COMMIT).
type Ctl struct {
	Peer   fabric.Addr
	Tag    fabric.Tag
	Conn   uint32
	Port   uint16 // PROBE_REPLY, CLAIM_REPLY, COMMIT
	Status uint8  // PROBE_REPLY, CLAIM_REPLY, COMMIT
	Reason uint8  // CLAIM_REPLY
}

// Encode fills fm with c.
func (c *Ctl) Encode(fm *fabric.Message) {
	switch c.Tag {
	case TagProbeRep:
		EncProbe(fm, c.Peer, c.Tag, c.Conn, c.Port, c.Status)
	case TagClaimRep:
		EncClaimRep(fm, c.Peer, c.Conn, c.Port, c.Status, c.Reason)
	case TagCommit:
		EncCommit(fm, c.Peer, c.Conn, c.Port, c.Status)
	default:
		EncCtl(fm, c.Peer, c.Tag, c.Conn)
	}
}
