package fabric

import "fmt"

// Descriptor is VELO's 8-byte descriptor (Figure 3.4), as it sits in a
// mailbox slot's status word or on a wire. On the send side Node is the
// target (or Group, with MC); in a mailbox it is the source, filled in by
// the NIC.
type Descriptor struct {
	Node NodeID
	VPID VPID
	Tag  Tag
	Len  uint8
	MC   bool
}

// Descriptor word layout:
//
//	0..15 node   16..23 vpid   24..31 tag   32..38 len (0..120)   39 mc
//	40..63 free for the backend (e.g. a ring sequence number); Decode
//	ignores them and Encode leaves them zero.
const (
	DescriptorSeqShift = 40
	descLenMask        = 0x7F
)

// Encode packs d into a descriptor word with the upper 24 bits zero.
func (d Descriptor) Encode() uint64 {
	w := uint64(d.Node) | uint64(d.VPID)<<16 | uint64(d.Tag)<<24 | uint64(d.Len&descLenMask)<<32
	if d.MC {
		w |= 1 << 39
	}
	return w
}

// DecodeDescriptor unpacks a descriptor word. It rejects a length over
// MaxVELOPayload and, with MC set, a group number >= MaxGroups.
func DecodeDescriptor(w uint64) (Descriptor, error) {
	d := Descriptor{
		Node: NodeID(w),
		VPID: VPID(w >> 16),
		Tag:  Tag(w >> 24),
		Len:  uint8(w >> 32 & descLenMask),
		MC:   w>>39&1 == 1,
	}
	if d.Len > MaxVELOPayload {
		return Descriptor{}, fmt.Errorf("velo descriptor: length %d > %d: %w", d.Len, MaxVELOPayload, ErrInvalid)
	}
	if d.MC && d.Node >= MaxGroups {
		return Descriptor{}, fmt.Errorf("velo descriptor: group %d >= %d: %w", d.Node, MaxGroups, ErrInvalid)
	}
	return d, nil
}

// CheckSend validates one outgoing message, so every backend rejects the
// same things with the same error.
func CheckSend(m *Message) error {
	if m.Len > MaxVELOPayload {
		return fmt.Errorf("velo send: length %d > %d: %w", m.Len, MaxVELOPayload, ErrInvalid)
	}
	if m.MC && m.Peer.Node >= MaxGroups {
		return fmt.Errorf("velo send: group %d >= %d: %w", m.Peer.Node, MaxGroups, ErrInvalid)
	}
	return nil
}
