package rdirect

// The cursor message (CDC, after Linux SMC's "connection data control"):
// one VELO message of cdcLen bytes, tag TagCDC, little-endian:
//
//	off size field
//	  0    1 magic and version: cdcMagic (0xC1, "CDC version 1")
//	  1    1 flags: fin 0x01, rd_closed 0x02, rst 0x04, writer_blocked 0x08;
//	         the other bits are zero
//	  2    1 upg: the sender's program's side's bits of the upgrade word
//	         as the sender's copy holds them (0 for a connection that
//	         never upgrades)
//	  3    1 echo: the receiver's program's side's bits of the upgrade
//	         word as the sender's copy holds them
//	  4    4 seq: 1, 2, 3 … per direction of the connection pair
//	  8    8 dst: the receiver's connection id (its LocalID, never 0)
//	 16    8 src: the sender's connection id (never 0)
//	 24    8 prod: the sender's producer cursor (bytes ever PUT and
//	         announced in its outbound direction)
//	 32    8 cons: the sender's consumer cursor (bytes its program ever
//	         consumed from its inbound direction)
//	 40    n with flag data (0x10) only, 1 ≤ n ≤ inlineMax: the stream's
//	         bytes [prod − n, prod), carried in the message instead of a
//	         PUT (small writes: one fabric message, no RMA completion to
//	         wait for on a fabric that does not order a PUT before a
//	         later send)
//
// upg and echo are 5-bit nibbles of the upgrade word (extds/dring's Upg
// constants, shim/upgrade.h) in an encoding of their own, the same for
// either side: att 0x01, mov 0x02, wsh 0x04, det 0x08, req 0x10; the
// other bits are zero. What the receiver makes of them is upgrade.go's.
// They were zero in version 1 before the upgrade crossed hosts, and
// the magic stayed: only a connection that upgrades sends them non-zero,
// and an older exnd, whose engine rejects them, refused every
// cross-host upgrade ("tcp") before agreeing anything, so no upgraded
// connection joins it to a newer one.
//
// decode checks every field it can alone; apply (conn.go) checks the
// cursors against the connection's state.

import (
	"encoding/binary"
	"errors"

	"github.com/exn-project/exn/fabric"
)

const (
	// TagCDC is the VELO tag of a cursor message on VPID.
	TagCDC fabric.Tag = 0xCD

	cdcMagic = 0xC1
	cdcLen   = 40

	flagFin      = 0x01
	flagRdClosed = 0x02
	flagRst      = 0x04
	flagBlocked  = 0x08
	flagData     = 0x10
	flagMask     = flagFin | flagRdClosed | flagRst | flagBlocked | flagData

	nibAtt  = 0x01
	nibMov  = 0x02
	nibWsh  = 0x04
	nibDet  = 0x08
	nibReq  = 0x10
	nibMask = nibAtt | nibMov | nibWsh | nibDet | nibReq

	// inlineMax is the most stream bytes a CDC carries itself: what one
	// VELO message holds beside the cursors. Writes up to it cost one
	// message; on net (no PutOrderer) a PUT costs its acknowledgement's
	// round trip before the CDC may follow (docs/direct.md, "Across
	// hosts"), which tripled a 64-byte ping-pong's one-way time.
	inlineMax = fabric.MaxVELOPayload - cdcLen
)

// cdc is one decoded cursor message.
type cdc struct {
	flags uint8
	upg   uint8 // the sender's side's nibble
	echo  uint8 // the receiver's side's nibble, as the sender sees it
	seq   uint32
	dst   uint64
	src   uint64
	prod  uint64
	cons  uint64
	data  []byte // flag data: the bytes before prod (decode: aliases the payload)
}

var errMalformed = errors.New("rdirect: malformed cursor message")

// encode writes c into m (payload and tag) for peer.
func (c *cdc) encode(m *fabric.Message, peer fabric.Addr) {
	flags := c.flags &^ flagData
	if len(c.data) > 0 {
		flags |= flagData
	}
	m.Peer, m.MC, m.Tag, m.Len = peer, false, TagCDC, uint8(cdcLen+copy(m.Data[cdcLen:], c.data))
	b := m.Data[:cdcLen]
	b[0], b[1], b[2], b[3] = cdcMagic, flags, c.upg, c.echo
	binary.LittleEndian.PutUint32(b[4:], c.seq)
	binary.LittleEndian.PutUint64(b[8:], c.dst)
	binary.LittleEndian.PutUint64(b[16:], c.src)
	binary.LittleEndian.PutUint64(b[24:], c.prod)
	binary.LittleEndian.PutUint64(b[32:], c.cons)
}

// decode parses a payload. It fails with errMalformed on a wrong
// length, magic, unknown flag or nibble bits, or a zero id.
func decode(b []byte, c *cdc) error {
	if len(b) < cdcLen || b[0] != cdcMagic || b[1]&^flagMask != 0 || b[2]&^nibMask != 0 || b[3]&^nibMask != 0 {
		return errMalformed
	}
	data := b[cdcLen:]
	if (len(data) > 0) != (b[1]&flagData != 0) || len(data) > inlineMax {
		return errMalformed
	}
	*c = cdc{
		flags: b[1],
		upg:   b[2],
		echo:  b[3],
		seq:   binary.LittleEndian.Uint32(b[4:]),
		dst:   binary.LittleEndian.Uint64(b[8:]),
		src:   binary.LittleEndian.Uint64(b[16:]),
		prod:  binary.LittleEndian.Uint64(b[24:]),
		cons:  binary.LittleEndian.Uint64(b[32:]),
	}
	if len(data) > 0 {
		c.data = data
	}
	if c.dst == 0 || c.src == 0 || uint64(len(data)) > c.prod {
		return errMalformed
	}
	return nil
}

// dstOf returns the destination id of an undecodable payload when it is
// long enough to carry one (0 otherwise): a malformed message that names
// a live connection from that connection's peer resets it.
func dstOf(b []byte) uint64 {
	if len(b) < 16 {
		return 0
	}
	return binary.LittleEndian.Uint64(b[8:])
}
