package fabric

import "fmt"

// NLA is a 64-bit network logical address. An NLA means something only
// together with the node it is used on, and RMA checks that it lies in a
// region registered to the addressed VPID.
//
// Every backend uses the same layout: the top 24 bits are a region index
// (1-based, so NLA 0 is never valid) and the low 40 bits a byte offset into
// it. Region lookup is therefore an index, not a search.
type NLA uint64

const (
	nlaOffsetBits = 40
	// MaxRegionSize is the largest region one NLA layout can address.
	MaxRegionSize = 1 << nlaOffsetBits
	// MaxRegions is the number of region indices per node.
	MaxRegions = 1<<(64-nlaOffsetBits) - 1
)

// MakeNLA builds the NLA of byte off in region idx (1..MaxRegions).
func MakeNLA(idx uint32, off uint64) NLA { return NLA(uint64(idx)<<nlaOffsetBits | off) }

// Region returns the region index of a.
func (a NLA) Region() uint32 { return uint32(a >> nlaOffsetBits) }

// Offset returns the byte offset of a within its region.
func (a NLA) Offset() uint64 { return uint64(a) & (MaxRegionSize - 1) }

func (a NLA) String() string { return fmt.Sprintf("nla:%d+%#x", a.Region(), a.Offset()) }

// CheckRange reports whether [a, a+n) lies inside a region of size bytes
// whose base is MakeNLA(a.Region(), 0). It is overflow-safe.
func CheckRange(a NLA, n uint64, size uint64) bool {
	off := a.Offset()
	return off <= size && n <= size-off
}

// CheckRMA validates the locally checkable parts of an RMA request.
func CheckRMA(r *RMA) error {
	switch {
	case r.Op != OpPut && r.Op != OpGet:
		return fmt.Errorf("rma: bad op %d: %w", r.Op, ErrInvalid)
	case r.Len == 0 || r.Len > MaxRMALen:
		return fmt.Errorf("rma: length %d not in 1..%d: %w", r.Len, MaxRMALen, ErrInvalid)
	case r.Notify&^(NotifyRequester|NotifyCompleter|NotifyResponder) != 0:
		return fmt.Errorf("rma: bad notify flags %#x: %w", r.Notify, ErrInvalid)
	case r.Op == OpPut && r.Notify&NotifyResponder != 0:
		return fmt.Errorf("rma: put has no responder notification (Table 3.1): %w", ErrInvalid)
	}
	return nil
}
