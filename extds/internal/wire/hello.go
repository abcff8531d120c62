package wire

// Handshake records of the shadow TCP connection (doc.go has the
// layout). No locks: every function works on its arguments only.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/exn-project/exn/fabric"
)

const (
	HelloLen = 32
	AckLen   = 8
	Version  = 1
	StatusOK = 0
	// StatusNoFab: the server is EXT-DS aware but cannot attach: plain
	// TCP.
	StatusNoFab = 1
	// StatusDirect: the server made a direct connection's shared buffer
	// (docs/direct.md); the reply names it: node, conn = the buffer's
	// token, ring = its 64-bit ID, ring size = bytes per direction.
	StatusDirect = 2
	// StatusNeedRing answers a direct offer the server will not take:
	// send the ordinary hello (with a ring) next.
	StatusNeedRing = 3
	MaxRingSize    = 64 << 20
	MinRingSize    = 4 << 10
	MinEagerWin    = FragData
	MaxEagerWin    = 16 << 20
	MagicHello     = "EXDS"
	MagicReply     = "EXDR"
	MagicAck       = "EXDA"
	// FlagDirect in a hello's byte 9: the client can take a direct
	// connection (its application runs under the shim on a fabric whose
	// memory it can map).
	FlagDirect = 1
)

// Hello is the handshake record both sides send (the reply reuses it).
type Hello struct {
	Status   uint8
	Flags    uint8 // hello only: FlagDirect
	Node     fabric.NodeID
	VPID     fabric.VPID
	Conn     uint32
	Ring     fabric.NLA
	RingSize uint32
	EagerWin uint32
}

// Encode writes h into b (HelloLen bytes) with magic.
func (h *Hello) Encode(b []byte, magic string) {
	copy(b[0:4], magic)
	b[4] = Version
	b[5] = h.Status
	binary.LittleEndian.PutUint16(b[6:], uint16(h.Node))
	b[8] = byte(h.VPID)
	b[9] = h.Flags
	binary.LittleEndian.PutUint32(b[10:], h.Conn)
	binary.LittleEndian.PutUint64(b[14:], uint64(h.Ring))
	binary.LittleEndian.PutUint32(b[22:], h.RingSize)
	binary.LittleEndian.PutUint32(b[26:], h.EagerWin)
	b[30], b[31] = 0, 0
}

// ErrHandshake marks a bad handshake record.
var ErrHandshake = errors.New("extds: bad handshake")

// DecodeHello parses a hello or reply. A status other than OK is returned
// without validating the rest (a server that cannot attach fills zeros).
func DecodeHello(b []byte, magic string) (Hello, error) {
	var h Hello
	if len(b) != HelloLen {
		return h, fmt.Errorf("record of %d bytes: %w", len(b), ErrHandshake)
	}
	if string(b[0:4]) != magic {
		return h, fmt.Errorf("bad magic %q: %w", b[0:4], ErrHandshake)
	}
	if b[4] != Version {
		return h, fmt.Errorf("version %d, want %d: %w", b[4], Version, ErrHandshake)
	}
	h.Status = b[5]
	h.Node = fabric.NodeID(binary.LittleEndian.Uint16(b[6:]))
	h.VPID = fabric.VPID(b[8])
	h.Conn = binary.LittleEndian.Uint32(b[10:])
	h.Ring = fabric.NLA(binary.LittleEndian.Uint64(b[14:]))
	h.RingSize = binary.LittleEndian.Uint32(b[22:])
	h.EagerWin = binary.LittleEndian.Uint32(b[26:])
	zeroRest := b[8] == 0 && b[9] == 0 && h.Conn == 0 && h.Ring == 0 && h.RingSize == 0 && h.EagerWin == 0 && b[30] == 0 && b[31] == 0
	switch {
	case h.Status == StatusNoFab:
		return Hello{Status: StatusNoFab}, nil
	case h.Status == StatusNeedRing && magic == MagicReply:
		if !zeroRest || h.Node != 0 {
			return h, fmt.Errorf("need-ring reply: reserved bytes set: %w", ErrHandshake)
		}
		return Hello{Status: StatusNeedRing}, nil
	case h.Status == StatusOK && magic == MagicHello && b[9] == FlagDirect && h.Ring == 0:
		// A direct offer: node only (the client has no ring yet).
		if b[8] != 0 || h.Conn != 0 || h.RingSize != 0 || h.EagerWin != 0 || b[30] != 0 || b[31] != 0 {
			return h, fmt.Errorf("direct offer: reserved bytes set: %w", ErrHandshake)
		}
		h.Flags = FlagDirect
		return h, nil
	case h.Status == StatusDirect && magic == MagicReply:
		switch {
		case b[8] != 0 || b[9] != 0 || h.EagerWin != 0 || b[30] != 0 || b[31] != 0:
			return h, fmt.Errorf("direct reply: reserved bytes set: %w", ErrHandshake)
		case h.Conn == 0 || h.Ring == 0:
			return h, fmt.Errorf("direct reply: zero token or id: %w", ErrHandshake)
		case h.RingSize < MinRingSize || h.RingSize > MaxRingSize || h.RingSize&(h.RingSize-1) != 0:
			return h, fmt.Errorf("direct reply: ring size %d: %w", h.RingSize, ErrHandshake)
		}
		return h, nil
	case h.Status != StatusOK:
		return h, fmt.Errorf("status %d: %w", h.Status, ErrHandshake)
	}
	if magic == MagicHello {
		h.Flags = b[9]
	}
	switch {
	case b[9]&^FlagDirect != 0 || (magic != MagicHello && b[9] != 0) || b[30] != 0 || b[31] != 0:
		return h, fmt.Errorf("reserved bytes set: %w", ErrHandshake)
	case h.Conn == 0:
		return h, fmt.Errorf("connection id 0: %w", ErrHandshake)
	case h.RingSize < MinRingSize || h.RingSize > MaxRingSize:
		return h, fmt.Errorf("ring size %d not in %d..%d: %w", h.RingSize, MinRingSize, MaxRingSize, ErrHandshake)
	case h.Ring == 0 || !fabric.CheckRange(h.Ring, uint64(h.RingSize), fabric.MaxRegionSize):
		return h, fmt.Errorf("ring %v+%d not addressable: %w", h.Ring, h.RingSize, ErrHandshake)
	case h.EagerWin < MinEagerWin || h.EagerWin > MaxEagerWin:
		return h, fmt.Errorf("eager window %d not in %d..%d: %w", h.EagerWin, MinEagerWin, MaxEagerWin, ErrHandshake)
	}
	return h, nil
}

// EncodeAck writes the ack of connection conn into b (AckLen bytes).
func EncodeAck(b []byte, conn uint32) {
	copy(b[0:4], MagicAck)
	binary.LittleEndian.PutUint32(b[4:], conn)
}

// DecodeAck checks that b is the ack of connection conn.
func DecodeAck(b []byte, conn uint32) error {
	if len(b) != AckLen || string(b[0:4]) != MagicAck {
		return fmt.Errorf("bad ack: %w", ErrHandshake)
	}
	if got := binary.LittleEndian.Uint32(b[4:]); got != conn {
		return fmt.Errorf("ack for conn %d, want %d: %w", got, conn, ErrHandshake)
	}
	return nil
}
