package extds

// Wire formats of EXT-DS.
//
// Fabric messages (VELO, §5.5.3.1). Every payload starts with the 4-byte
// little-endian connection ID the *receiver* assigned in the handshake, so
// one virtual-device endpoint demultiplexes many connections. The rest
// depends on the tag; every length is checked exactly.
//
//	tag           payload after the conn ID            bytes
//	VELO          1..116 data bytes                     5..120
//	VELO_LAST     1..116 data bytes (last of a write)   5..120
//	RMA_INFO      ring offset u32, length u32           12
//	RMA_AVAIL     ring bytes freed u32, eager freed u32 12
//	SHUTDOWN      -                                     4
//	RESET         -                                     4
//	ZC_SRC        source NLA u64, length u32            16   (ZCopy read)
//	ZC_WANT       length u32                            8    (ZCopy write)
//	ZC_SINK       sink NLA u64, length u32              16   (ZCopy write)
//	ZC_PUT        length u32                            8    (ZCopy write)
//	ZC_DONE       -                                     4
//	NOCONN        -  (conn = the unknown ID it answers)   4
//	PROBE         port u16, 0 u8, 0 u8 (conn = token)   8
//	PROBE_REPLY   port u16, status u8, 0 u8             8
//	CLAIM         see claim.go                          44
//	CLAIM_REPLY   see claim.go                          8
//
// NOCONN answers a data message addressed to a connection ID the receiver
// does not know (released, stale): its ID field is that unknown ID, i.e.
// the *sender's* peer ID, so the sender finds its connection by (source
// address, peer ID) and fails it with ECONNRESET instead of waiting for
// credits forever. PROBE asks the node's Device whether an EXT-DS
// listener is registered for a TCP port; its ID field is a token chosen by
// the prober and echoed in PROBE_REPLY (status 1: listening, 0: not).
//
// Handshake (shadow TCP connection, fixed 32-byte records, little-endian):
//
//	hello  client→server: "EXDS" ver u8 status u8 node u16 vpid u8 flags u8
//	                      conn u32 ring NLA u64 ring size u32 eager window u32
//	reply  server→client: "EXDR" ver u8 status u8 node u16 vpid u8 0 u8
//	                      conn u32 ring NLA u64 ring size u32 eager window u32
//	ack    client→server: "EXDA" conn u32 (the server's conn ID), 8 bytes
//
// A direct offer (direct.go) is a hello with flags = flagDirect and only
// the node set; its answers are a reply with status statusDirect (node,
// conn = token, ring = the buffer's ID, ring size) or statusNeedRing
// (all else zero: send the ordinary hello), or statusNoFab.

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
	// TagClaim and TagClaimRep (0x4E, 0x4F) are in claim.go,
	// TagClaimDirect and TagCommit (0x52, 0x53) in claimdirect.go.
	tagLast = TagCommit
)

const (
	hdrLen = 4
	// fragData is the user data one VELO fragment carries: the 120-byte
	// payload less the connection ID.
	fragData = fabric.MaxVELOPayload - hdrLen
)

// ErrProtocol marks a peer that broke the EXT-DS protocol (a malformed
// message, a credit overflow, an RMA_INFO outside the ring). The
// connection is reset.
var ErrProtocol = errors.New("extds: protocol violation")

// msg is a decoded fabric message. data aliases the fabric.Message
// payload: decoding allocates nothing.
type msg struct {
	tag  fabric.Tag
	conn uint32
	a, b uint32 // offset/length, ring/eager credits, or length
	nla  fabric.NLA
	data []byte
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
	TagClaim - TagVELO:    claimLen,
	TagClaimRep - TagVELO: claimRepLen,
	// 0x50, 0x51: fabric/fping's tags, not EXT-DS's (0: unknown).
	TagClaimDirect - TagVELO: claimDirectLen,
	TagCommit - TagVELO:      commitLen,
}

// decodeMsg parses one fabric message's payload. It rejects unknown tags,
// wrong lengths, a zero connection ID, empty data fragments and zero
// lengths, with ErrProtocol.
func decodeMsg(tag fabric.Tag, p []byte, m *msg) error {
	if tag < TagVELO || tag > tagLast || tag > TagVELOLast && wantLen[tag-TagVELO] == 0 {
		return errBadTag
	}
	if len(p) < hdrLen {
		return errShort
	}
	*m = msg{tag: tag, conn: binary.LittleEndian.Uint32(p)}
	if m.conn == 0 {
		return errZeroConn
	}
	switch tag {
	case TagVELO, TagVELOLast:
		if len(p) == hdrLen {
			return errEmpty
		}
		m.data = p[hdrLen:]
		return nil
	}
	if len(p) != wantLen[tag-TagVELO] {
		return errLength
	}
	switch tag {
	case TagRMAInfo, TagRMAAvail:
		m.a = binary.LittleEndian.Uint32(p[4:])
		m.b = binary.LittleEndian.Uint32(p[8:])
		if tag == TagRMAInfo && m.b == 0 || tag == TagRMAAvail && m.a == 0 && m.b == 0 {
			return errZeroLen
		}
	case TagZCSrc, TagZCSink:
		m.nla = fabric.NLA(binary.LittleEndian.Uint64(p[4:]))
		m.b = binary.LittleEndian.Uint32(p[12:])
		if m.b == 0 || m.nla == 0 {
			return errZeroLen
		}
	case TagClaim, TagClaimRep, TagClaimDirect, TagCommit:
		m.data = p[hdrLen:] // claim.go / claimdirect.go decode and check the rest
	case TagZCWant, TagZCPut:
		m.b = binary.LittleEndian.Uint32(p[4:])
		if m.b == 0 {
			return errZeroLen
		}
	case TagProbe, TagProbeRep:
		m.a = uint32(binary.LittleEndian.Uint16(p[4:]))
		m.b = uint32(p[6])
		switch {
		case p[7] != 0:
			return errReserved
		case m.a == 0:
			return errZeroLen
		case tag == TagProbe && m.b != 0 || m.b > 1:
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

// encode helpers fill a fabric.Message in place.

func putHdr(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn uint32, n int) {
	fm.Peer = peer
	fm.MC = false
	fm.Tag = tag
	fm.Len = uint8(n)
	binary.LittleEndian.PutUint32(fm.Data[:], conn)
}

func encData(fm *fabric.Message, peer fabric.Addr, conn uint32, last bool, data []byte) {
	tag := TagVELO
	if last {
		tag = TagVELOLast
	}
	n := copy(fm.Data[hdrLen:], data)
	putHdr(fm, peer, tag, conn, hdrLen+n)
}

func encTwo(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn, a, b uint32) {
	putHdr(fm, peer, tag, conn, 12)
	binary.LittleEndian.PutUint32(fm.Data[4:], a)
	binary.LittleEndian.PutUint32(fm.Data[8:], b)
}

func encCtl(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn uint32) {
	putHdr(fm, peer, tag, conn, hdrLen)
}

func encLen(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn, n uint32) {
	putHdr(fm, peer, tag, conn, 8)
	binary.LittleEndian.PutUint32(fm.Data[4:], n)
}

func encProbe(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, token uint32, port uint16, status uint8) {
	putHdr(fm, peer, tag, token, 8)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = status, 0
}

func encNLA(fm *fabric.Message, peer fabric.Addr, tag fabric.Tag, conn uint32, nla fabric.NLA, n uint32) {
	putHdr(fm, peer, tag, conn, 16)
	binary.LittleEndian.PutUint64(fm.Data[4:], uint64(nla))
	binary.LittleEndian.PutUint32(fm.Data[12:], n)
}

// Handshake records.

const (
	helloLen    = 32
	ackLen      = 8
	wireVersion = 1
	statusOK    = 0
	statusNoFab = 1 // server is EXT-DS aware but cannot attach: plain TCP
	// statusDirect: the server made a direct connection's shared buffer
	// (docs/direct.md); the reply names it: node, conn = the buffer's
	// token, ring = its 64-bit ID, ring size = bytes per direction.
	statusDirect = 2
	// statusNeedRing answers a direct offer the server will not take:
	// send the ordinary hello (with a ring) next.
	statusNeedRing = 3
	maxRingSize    = 64 << 20
	minRingSize    = 4 << 10
	minEagerWin    = fragData
	maxEagerWin    = 16 << 20
	magicHello     = "EXDS"
	magicReply     = "EXDR"
	magicAck       = "EXDA"
	flagsDefault   = 0
	// flagDirect in a hello's byte 9: the client can take a direct
	// connection (its application runs under the shim on a fabric whose
	// memory it can map).
	flagDirect = 1
)

// hello is the handshake record both sides send (the reply reuses it).
type hello struct {
	status   uint8
	flags    uint8 // hello only: flagDirect
	node     fabric.NodeID
	vpid     fabric.VPID
	conn     uint32
	ring     fabric.NLA
	ringSize uint32
	eagerWin uint32
}

func (h *hello) encode(b []byte, magic string) {
	copy(b[0:4], magic)
	b[4] = wireVersion
	b[5] = h.status
	binary.LittleEndian.PutUint16(b[6:], uint16(h.node))
	b[8] = byte(h.vpid)
	b[9] = h.flags
	binary.LittleEndian.PutUint32(b[10:], h.conn)
	binary.LittleEndian.PutUint64(b[14:], uint64(h.ring))
	binary.LittleEndian.PutUint32(b[22:], h.ringSize)
	binary.LittleEndian.PutUint32(b[26:], h.eagerWin)
	b[30], b[31] = 0, 0
}

var errHandshake = errors.New("extds: bad handshake")

// decodeHello parses a hello or reply. A status other than OK is returned
// without validating the rest (a server that cannot attach fills zeros).
func decodeHello(b []byte, magic string) (hello, error) {
	var h hello
	if len(b) != helloLen {
		return h, fmt.Errorf("record of %d bytes: %w", len(b), errHandshake)
	}
	if string(b[0:4]) != magic {
		return h, fmt.Errorf("bad magic %q: %w", b[0:4], errHandshake)
	}
	if b[4] != wireVersion {
		return h, fmt.Errorf("version %d, want %d: %w", b[4], wireVersion, errHandshake)
	}
	h.status = b[5]
	h.node = fabric.NodeID(binary.LittleEndian.Uint16(b[6:]))
	h.vpid = fabric.VPID(b[8])
	h.conn = binary.LittleEndian.Uint32(b[10:])
	h.ring = fabric.NLA(binary.LittleEndian.Uint64(b[14:]))
	h.ringSize = binary.LittleEndian.Uint32(b[22:])
	h.eagerWin = binary.LittleEndian.Uint32(b[26:])
	zeroRest := b[8] == 0 && b[9] == 0 && h.conn == 0 && h.ring == 0 && h.ringSize == 0 && h.eagerWin == 0 && b[30] == 0 && b[31] == 0
	switch {
	case h.status == statusNoFab:
		return hello{status: statusNoFab}, nil
	case h.status == statusNeedRing && magic == magicReply:
		if !zeroRest || h.node != 0 {
			return h, fmt.Errorf("need-ring reply: reserved bytes set: %w", errHandshake)
		}
		return hello{status: statusNeedRing}, nil
	case h.status == statusOK && magic == magicHello && b[9] == flagDirect && h.ring == 0:
		// A direct offer: node only (the client has no ring yet).
		if b[8] != 0 || h.conn != 0 || h.ringSize != 0 || h.eagerWin != 0 || b[30] != 0 || b[31] != 0 {
			return h, fmt.Errorf("direct offer: reserved bytes set: %w", errHandshake)
		}
		h.flags = flagDirect
		return h, nil
	case h.status == statusDirect && magic == magicReply:
		switch {
		case b[8] != 0 || b[9] != 0 || h.eagerWin != 0 || b[30] != 0 || b[31] != 0:
			return h, fmt.Errorf("direct reply: reserved bytes set: %w", errHandshake)
		case h.conn == 0 || h.ring == 0:
			return h, fmt.Errorf("direct reply: zero token or id: %w", errHandshake)
		case h.ringSize < minRingSize || h.ringSize > maxRingSize || h.ringSize&(h.ringSize-1) != 0:
			return h, fmt.Errorf("direct reply: ring size %d: %w", h.ringSize, errHandshake)
		}
		return h, nil
	case h.status != statusOK:
		return h, fmt.Errorf("status %d: %w", h.status, errHandshake)
	}
	if magic == magicHello {
		h.flags = b[9]
	}
	switch {
	case b[9]&^flagDirect != 0 || (magic != magicHello && b[9] != 0) || b[30] != 0 || b[31] != 0:
		return h, fmt.Errorf("reserved bytes set: %w", errHandshake)
	case h.conn == 0:
		return h, fmt.Errorf("connection id 0: %w", errHandshake)
	case h.ringSize < minRingSize || h.ringSize > maxRingSize:
		return h, fmt.Errorf("ring size %d not in %d..%d: %w", h.ringSize, minRingSize, maxRingSize, errHandshake)
	case h.ring == 0 || !fabric.CheckRange(h.ring, uint64(h.ringSize), fabric.MaxRegionSize):
		return h, fmt.Errorf("ring %v+%d not addressable: %w", h.ring, h.ringSize, errHandshake)
	case h.eagerWin < minEagerWin || h.eagerWin > maxEagerWin:
		return h, fmt.Errorf("eager window %d not in %d..%d: %w", h.eagerWin, minEagerWin, maxEagerWin, errHandshake)
	}
	return h, nil
}

func encodeAck(b []byte, conn uint32) {
	copy(b[0:4], magicAck)
	binary.LittleEndian.PutUint32(b[4:], conn)
}

func decodeAck(b []byte, conn uint32) error {
	if len(b) != ackLen || string(b[0:4]) != magicAck {
		return fmt.Errorf("bad ack: %w", errHandshake)
	}
	if got := binary.LittleEndian.Uint32(b[4:]); got != conn {
		return fmt.Errorf("ack for conn %d, want %d: %w", got, conn, errHandshake)
	}
	return nil
}
