package fabnet

// Wire format. Every connection starts with one hello in each direction,
// then carries frames until it dies:
//
//	hello (24 bytes, both directions, dialer first):
//	  0..3  magic "EXNF"   4..5 version (LE)   6..7 node ID (LE)
//	  8..15 incarnation (LE, random per NIC)   16..23 reserved, zero
//
//	frame:
//	  prefix (8 bytes): 0..3 body length (LE, bytes after the prefix)
//	                    4 type   5 flags   6 a   7 b
//	  body:             a fixed header whose size the type fixes, then
//	                    payload (VELO payload or RMA chunk data)
//
// a and b are VPIDs: a is the sender's VPID, b the receiver's (for the
// single-VPID credit frames, b is the VPID whose mailbox is meant: on the
// node that owns it). All integers are little-endian. decodePrefix rejects
// an unknown type, a body over maxBody or under the type's fixed size, and
// a VELO body whose length disagrees with its descriptor, before anything
// is read past the prefix — so a hostile peer cannot make the reader
// allocate or wait for more than one frame's worth of bytes.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/exn-project/exn/fabric"
)

const (
	helloMagic = "EXNF"
	helloSize  = 24
	// protoVersion 2: the get-done frame is sent only for GETs that
	// notify the responder and nobody on the requester side (version 1
	// sent it for every GET with a responder notification).
	protoVersion = 2

	prefixSize = 8

	// chunkSize is the most RMA data one frame carries. 64 KiB is one
	// loopback TCP segment burst and bounds how long a VELO message waits
	// behind bulk data on the same connection (one chunk, ~10 µs on
	// loopback), while keeping the per-frame cost (header, syscall share)
	// under 0.1 % of the payload.
	chunkSize = 64 << 10

	// maxFixed is the largest fixed header (PUT data, GET request).
	maxFixed = 24
	// maxBody is the largest frame body accepted: the biggest fixed
	// header plus one chunk. Anything longer is a protocol violation and
	// is refused from the prefix alone.
	maxBody = maxFixed + chunkSize
)

// Frame types.
const (
	tHeartbeat = 1  // no body
	tVELO      = 2  // descriptor word (8) + payload; a = src vpid, b = dst vpid
	tCreditReq = 3  // no body; b = vpid on the receiving node
	tGrant     = 4  // count u32; b = vpid on the sending node
	tNoVPID    = 5  // no body; b = vpid on the sending node (not open)
	tClosed    = 6  // no body; b = vpid on the sending node (closed)
	tPutData   = 7  // reqID u64, remote NLA u64, total u32, off u32 + data
	tPutAck    = 8  // reqID u64; flags high nibble = NotifyErr
	tGetReq    = 9  // reqID u64, remote NLA u64, len u32, pad u32
	tGetData   = 10 // reqID u64, off u32 + data; flags high nibble = NotifyErr
	tGetDone   = 11 // reqID u64: the data landed (sent only if needGetDone)
	numTypes   = 12
)

// Frame flags.
const (
	fLast  = 1 << 0 // last chunk of an RMA transfer (PUT data, GET data)
	fAbort = 1 << 1 // PUT data: the requester gave up (its region died)
	// Bits 4..6 carry the fabric.Notify flags on PUT data and GET
	// requests, and bits 4..7 the NotifyErr on PUT acks and GET data.
	flagShift = 4
)

// fixedSize is the fixed body size per type; -1 marks an unused type.
var fixedSize = [numTypes]int{-1, 0, 8, 0, 4, 0, 0, 24, 8, 24, 12, 8}

// hasPayload says whether a type carries bytes after its fixed header.
var hasPayload = [numTypes]bool{tVELO: true, tPutData: true, tGetData: true}

var typeNames = [numTypes]string{"?", "heartbeat", "velo", "credit-req", "grant", "no-vpid", "closed", "put-data", "put-ack", "get-req", "get-data", "get-done"}

// errProto is wrapped by every protocol violation a peer can commit.
var errProto = errors.New("protocol violation")

// prefix is a decoded frame prefix.
type prefix struct {
	n     uint32 // body length
	typ   uint8
	flags uint8
	a, b  fabric.VPID
}

func (p prefix) payloadLen() int { return int(p.n) - fixedSize[p.typ] }

func putPrefix(b []byte, n int, typ, flags uint8, a, bb fabric.VPID) {
	binary.LittleEndian.PutUint32(b[0:4], uint32(n))
	b[4], b[5], b[6], b[7] = typ, flags, byte(a), byte(bb)
}

// decodePrefix validates a frame prefix. It never looks past the 8 bytes
// and is the only gate between the socket and every read that follows.
func decodePrefix(b []byte) (prefix, error) {
	p := prefix{n: binary.LittleEndian.Uint32(b[0:4]), typ: b[4], flags: b[5], a: fabric.VPID(b[6]), b: fabric.VPID(b[7])}
	if p.typ == 0 || p.typ >= numTypes {
		return prefix{}, fmt.Errorf("frame type %d: %w", p.typ, errProto)
	}
	if p.n > maxBody {
		return prefix{}, fmt.Errorf("%s frame of %d bytes > %d: %w", typeNames[p.typ], p.n, maxBody, errOversized)
	}
	fs := fixedSize[p.typ]
	if int(p.n) < fs || (!hasPayload[p.typ] && int(p.n) != fs) {
		return prefix{}, fmt.Errorf("%s frame of %d bytes, want %d: %w", typeNames[p.typ], p.n, fs, errProto)
	}
	if p.typ == tVELO && p.n-8 > fabric.MaxVELOPayload {
		return prefix{}, fmt.Errorf("velo frame with %d payload bytes: %w", p.n-8, errProto)
	}
	if (p.typ == tPutData || p.typ == tGetData) && p.payloadLen() > chunkSize {
		return prefix{}, fmt.Errorf("%s chunk of %d bytes: %w", typeNames[p.typ], p.payloadLen(), errProto)
	}
	return p, nil
}

// errOversized is a frame whose prefix announces more than maxBody.
var errOversized = fmt.Errorf("oversized frame: %w", errProto)

// hello is the connection preamble.
type hello struct {
	version uint16
	node    fabric.NodeID
	boot    uint64
}

func (h hello) encode(b []byte) {
	copy(b[0:4], helloMagic)
	binary.LittleEndian.PutUint16(b[4:6], h.version)
	binary.LittleEndian.PutUint16(b[6:8], uint16(h.node))
	binary.LittleEndian.PutUint64(b[8:16], h.boot)
	clear(b[16:helloSize])
}

var (
	errBadMagic   = errors.New("bad magic")
	errBadVersion = errors.New("unsupported protocol version")
)

func decodeHello(b []byte) (hello, error) {
	if string(b[0:4]) != helloMagic {
		return hello{}, fmt.Errorf("hello: %w", errBadMagic)
	}
	h := hello{
		version: binary.LittleEndian.Uint16(b[4:6]),
		node:    fabric.NodeID(binary.LittleEndian.Uint16(b[6:8])),
		boot:    binary.LittleEndian.Uint64(b[8:16]),
	}
	if h.version != protoVersion {
		return hello{}, fmt.Errorf("hello: version %d, want %d: %w", h.version, protoVersion, errBadVersion)
	}
	for _, c := range b[16:helloSize] {
		if c != 0 {
			return hello{}, fmt.Errorf("hello: reserved bytes set: %w", errProto)
		}
	}
	return h, nil
}

func putU64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }
func putU32(b []byte, v uint32) { binary.LittleEndian.PutUint32(b, v) }
