package fabric

import (
	"encoding/binary"
	"fmt"
)

// NotifyKind says which RMA unit wrote a notification.
type NotifyKind uint8

const (
	KindRequester NotifyKind = 1
	KindCompleter NotifyKind = 2
	KindResponder NotifyKind = 3
)

var kindNames = [...]string{KindRequester: "requester", KindCompleter: "completer", KindResponder: "responder"}

func (k NotifyKind) String() string { return enumString(kindNames[:], uint8(k), "kind") }

// NotifyErr is the error field of a notification. Zero means success.
type NotifyErr uint8

const (
	NErrNone NotifyErr = iota
	// NErrAccess: the remote NLA is not in a region registered to the
	// addressed VPID (unregistered, or registered to another VPID).
	NErrAccess
	// NErrBounds: the range runs past the end of its region.
	NErrBounds
	// NErrPeerDown: the peer node or VPID is gone.
	NErrPeerDown
	numNotifyErr
)

var notifyErrNames = [numNotifyErr]string{NErrNone: "ok", NErrAccess: "access", NErrBounds: "bounds", NErrPeerDown: "peer down"}

func (e NotifyErr) String() string { return enumString(notifyErrNames[:], uint8(e), "err") }

// Notification is one RMA notification: two 64-bit words in hardware
// (Figure 5.10). Encode and DecodeNotification give that wire form.
type Notification struct {
	Kind NotifyKind
	Op   Op
	Err  NotifyErr
	// Peer is the other endpoint of the transfer.
	Peer Addr
	// Len is the transfer length in bytes.
	Len uint32
	// Local is the address on the notified node that the transfer touched:
	// for a transfer longer than RMAMTU, the start of its last RMA MTU
	// packet (LastFrame). On an error notification it is the requester's
	// Local as posted.
	Local NLA
}

// NotificationSize is the encoded size of a Notification.
const NotificationSize = 16

// Word 0 layout (little-endian bit numbers):
//
//	0..1   op      2..3  kind    4..7  err (4 bits)
//	8..23  peer node             24..31 peer vpid
//	32..55 length (24 bits: 8 MiB fits)  56..63 reserved, zero
//
// Word 1 is the local NLA.
const notifyReservedMask = 0xFF << 56

// Encode writes n's two-word wire form into b, which must hold
// NotificationSize bytes.
func (n *Notification) Encode(b []byte) {
	w0 := uint64(n.Op&3) | uint64(n.Kind&3)<<2 | uint64(n.Err&0xF)<<4 |
		uint64(n.Peer.Node)<<8 | uint64(n.Peer.VPID)<<24 | uint64(n.Len&0xFFFFFF)<<32
	binary.LittleEndian.PutUint64(b[0:8], w0)
	binary.LittleEndian.PutUint64(b[8:16], uint64(n.Local))
}

// DecodeNotification parses a notification's wire form. It rejects short
// input, unknown ops, kinds and errors, reserved bits, and lengths over
// MaxRMALen, with ErrInvalid.
func DecodeNotification(b []byte) (Notification, error) {
	if len(b) < NotificationSize {
		return Notification{}, fmt.Errorf("notification: %d bytes: %w", len(b), ErrInvalid)
	}
	w0 := binary.LittleEndian.Uint64(b[0:8])
	n := Notification{
		Op:    Op(w0 & 3),
		Kind:  NotifyKind(w0 >> 2 & 3),
		Err:   NotifyErr(w0 >> 4 & 0xF),
		Peer:  Addr{Node: NodeID(w0 >> 8), VPID: VPID(w0 >> 24)},
		Len:   uint32(w0 >> 32 & 0xFFFFFF),
		Local: NLA(binary.LittleEndian.Uint64(b[8:16])),
	}
	switch {
	case w0&notifyReservedMask != 0:
		return Notification{}, fmt.Errorf("notification: reserved bits set: %w", ErrInvalid)
	case n.Op != OpPut && n.Op != OpGet:
		return Notification{}, fmt.Errorf("notification: bad op %d: %w", n.Op, ErrInvalid)
	case n.Kind == 0:
		return Notification{}, fmt.Errorf("notification: bad kind 0: %w", ErrInvalid)
	case n.Err >= numNotifyErr:
		return Notification{}, fmt.Errorf("notification: bad error code %d: %w", n.Err, ErrInvalid)
	case n.Len > MaxRMALen:
		return Notification{}, fmt.Errorf("notification: length %d > %d: %w", n.Len, MaxRMALen, ErrInvalid)
	}
	return n, nil
}

// LastFrame returns the address of the last RMA MTU packet of a transfer
// of length bytes starting at start: equations 5.1 and 5.2. For length 0 it
// returns start.
func LastFrame(start NLA, length uint32) NLA {
	if length == 0 {
		return start
	}
	rest := length % RMAMTU // (5.1)
	if rest == 0 {
		return start + NLA(length) - RMAMTU // (5.2 I)
	}
	return start + NLA(length) - NLA(rest) // (5.2 II)
}
