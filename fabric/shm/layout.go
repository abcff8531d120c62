package shm

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/exn-project/exn/fabric"
)

// File layouts. Everything is little-endian and every shared word is
// naturally aligned (files are mapped page-aligned). Anything read from
// another process's file is validated by the decode functions below before
// it is used as a size or an offset: another process may have scribbled on
// it.

const (
	pageSize = 4096

	nodeMagic   = 0x314e4d4853584e45 // "ENXSHMN1"
	vpidMagic   = 0x31564d4853584e45 // "ENXSHMV1"
	fabricMagic = 0x31464d4853584e45 // "ENXSHMF1"
	// layoutVersion 2: the lease table in the node header and the region
	// table extended by the leases' region blocks (see lease.go).
	// 3: the VPID header's wait mode, rung and bell-sleeper words (a
	// consumer may sleep on a doorbell FIFO that version-2 producers would
	// never ring).
	layoutVersion = 4

	// maxFabricName bounds the fabric name so every file name stays well
	// under NAME_MAX (255) with the node, incarnation and region suffixes.
	maxFabricName = 64

	// maxNodeRegions is the size of a node's region table. 4096 entries of
	// 16 bytes keep the node file at 68 KiB (sparse on tmpfs) while letting
	// EXT-Eth and EXT-DS register hundreds of buffers per node.
	maxNodeRegions  = 4096
	regionEntrySize = 16

	// Mailbox and notification queue sizes: powers of two, so a position
	// maps to a slot with a mask. The bounds keep a VPID file under 16 MiB.
	DefaultSlots    = 1024
	minSlots        = 2
	maxSlots        = 1 << 16
	minNotifyDepth  = fabric.DefaultNotifyDepth
	maxNotifyDepth  = 1 << 18
	notifyEntrySize = 32
)

// Node file header offsets.
const (
	nOffMagic    = 0
	nOffVersion  = 8  // u32
	nOffNode     = 12 // u32
	nOffPID      = 16 // u32
	nOffState    = 20 // u32, atomic
	nOffInc      = 24 // u64
	nOffGroups   = 32 // u64, atomic
	nOffLeases   = 1024
	nOffRegions  = pageSize
	nodeFileSize = nOffRegions + maxTableRegions*regionEntrySize
)

// Lease table (lease.go): maxLeases entries of leaseEntrySize bytes at
// nOffLeases, in the node file's header page. Lease s owns region indices
// leaseRegionLo(s) .. +leaseRegions-1, above the owner's own 1..maxNodeRegions.
const (
	maxLeases       = 16
	leaseEntrySize  = 64
	leaseRegions    = 256
	maxTableRegions = maxNodeRegions + maxLeases*leaseRegions

	lOffState  = 0  // u32, atomic: leaseFree / leaseGranted / leaseRevoked; stored last
	lOffHold   = 4  // u32, atomic: holdNone / holdAttached / holdDetached
	lOffBase   = 8  // u32: first VPID
	lOffCount  = 12 // u32: number of VPIDs
	lOffPID    = 16 // u32: the process the owner granted it to (0: any)
	lOffHolder = 20 // u32: the process that attached
	lOffSecret = 32 // 2 x u64: the token's secret
)

// Node states (nOffState).
const (
	nodeAlive      = 1
	nodeClosed     = 2 // closed gracefully
	nodeReclaiming = 3 // a peer holds the dead node's lock and unlinks its files
)

// VPID file header offsets. Words written by producers and by the consumer
// sit on separate cache lines.
const (
	vOffMagic    = 0
	vOffVersion  = 8   // u32
	vOffNode     = 12  // u32
	vOffVPID     = 16  // u32
	vOffSlots    = 20  // u32
	vOffDepth    = 24  // u32
	vOffState    = 28  // u32, atomic: vpidOpen / vpidClosed
	vOffStats    = 32  // 8 x u64 counters kept for the owner, see vstat*
	vOffTail     = 128 // u64: mailbox tail, producers CAS
	vOffDoorbell = 192 // u32 futex: consumer sleeps on it
	vOffSleepers = 196 // u32: consumers asleep on the doorbell
	vOffWaitMode = 200 // u32: waitFutex / waitBell, fixed before the file is linked
	vOffRung     = 204 // u32, atomic: 1 once a producer rang the bell since the consumer last slept
	vOffBellW    = 208 // u32: consumers asleep on the doorbell FIFO
	vOffSpace    = 256 // u32 futex: blocked senders sleep on it
	vOffSpaceW   = 260 // u32: senders asleep on space or parked on the space bell
	vOffSpaceRng = 264 // u32, atomic: 1 once the consumer rang the space bell since a sender last cleared it
	vOffNTail    = 320 // u64: notification tail, producers CAS
	vOffMailbox  = pageSize
)

// Per-VPID counters in the header, bumped by whichever process delivers a
// notification so the owner's Stats see them (as with fabric/mem, a
// notification is counted at the queue it lands in).
const (
	vstatOverflow = 0
	vstatKind     = 1 // + kind (1..3)
	vstatErr      = 4 // + err (1..3)
	numVStats     = 7
)

const (
	vpidOpen   = 1
	vpidClosed = 2
)

// Wait modes (vOffWaitMode): how the VPID's consumer sleeps, so how a
// producer wakes it (see ring.go and wait.go).
const (
	waitFutex = 0 // FUTEX_WAIT on the doorbell word: FUTEX_WAKE it
	waitBell  = 1 // parked on the doorbell FIFO <vpid file>.bell: write a byte
)

func vpidFileSize(slots, depth int) int {
	return vOffMailbox + slots*fabric.SlotSize + depth*notifyEntrySize
}

// nodeHeader is the decoded, validated node file header.
type nodeHeader struct {
	Node  fabric.NodeID
	PID   uint32
	State uint32
	Inc   uint64
}

// decodeNodeHeader validates a node file header read from shared memory.
// want is the node ID the file name promises.
func decodeNodeHeader(b []byte, want fabric.NodeID) (nodeHeader, error) {
	if len(b) < nOffRegions {
		return nodeHeader{}, fmt.Errorf("node header: %d bytes: %w", len(b), fabric.ErrInvalid)
	}
	le := binary.LittleEndian
	h := nodeHeader{
		PID:   le.Uint32(b[nOffPID:]),
		State: le.Uint32(b[nOffState:]),
		Inc:   le.Uint64(b[nOffInc:]),
	}
	node := le.Uint32(b[nOffNode:])
	switch {
	case le.Uint64(b[nOffMagic:]) != nodeMagic:
		return nodeHeader{}, fmt.Errorf("node header: bad magic: %w", fabric.ErrInvalid)
	case le.Uint32(b[nOffVersion:]) != layoutVersion:
		return nodeHeader{}, fmt.Errorf("node header: version %d: %w", le.Uint32(b[nOffVersion:]), fabric.ErrInvalid)
	case node != uint32(want):
		return nodeHeader{}, fmt.Errorf("node header: node %d, want %d: %w", node, want, fabric.ErrInvalid)
	case h.Inc == 0:
		return nodeHeader{}, fmt.Errorf("node header: zero incarnation: %w", fabric.ErrInvalid)
	case h.State < nodeAlive || h.State > nodeReclaiming:
		return nodeHeader{}, fmt.Errorf("node header: state %d: %w", h.State, fabric.ErrInvalid)
	}
	h.Node = want
	return h, nil
}

func encodeNodeHeader(b []byte, h nodeHeader) {
	le := binary.LittleEndian
	le.PutUint64(b[nOffMagic:], nodeMagic)
	le.PutUint32(b[nOffVersion:], layoutVersion)
	le.PutUint32(b[nOffNode:], uint32(h.Node))
	le.PutUint32(b[nOffPID:], h.PID)
	le.PutUint32(b[nOffState:], h.State)
	le.PutUint64(b[nOffInc:], h.Inc)
}

// vpidHeader is the decoded, validated VPID file header.
type vpidHeader struct {
	Addr  fabric.Addr
	Slots int
	Depth int
	Bell  bool // wait mode waitBell
}

// decodeVPIDHeader validates a VPID file header; size is the file's size
// from fstat, so the ring geometry it promises is known to be backed.
func decodeVPIDHeader(b []byte, want fabric.Addr, size int64) (vpidHeader, error) {
	if len(b) < vOffMailbox {
		return vpidHeader{}, fmt.Errorf("vpid header: %d bytes: %w", len(b), fabric.ErrInvalid)
	}
	le := binary.LittleEndian
	h := vpidHeader{
		Addr:  fabric.Addr{Node: fabric.NodeID(le.Uint32(b[vOffNode:])), VPID: fabric.VPID(le.Uint32(b[vOffVPID:]))},
		Slots: int(le.Uint32(b[vOffSlots:])),
		Depth: int(le.Uint32(b[vOffDepth:])),
		Bell:  le.Uint32(b[vOffWaitMode:]) == waitBell,
	}
	switch {
	case le.Uint64(b[vOffMagic:]) != vpidMagic:
		return vpidHeader{}, fmt.Errorf("vpid header: bad magic: %w", fabric.ErrInvalid)
	case le.Uint32(b[vOffVersion:]) != layoutVersion:
		return vpidHeader{}, fmt.Errorf("vpid header: version %d: %w", le.Uint32(b[vOffVersion:]), fabric.ErrInvalid)
	case le.Uint32(b[vOffNode:]) != uint32(want.Node) || le.Uint32(b[vOffVPID:]) != uint32(want.VPID):
		return vpidHeader{}, fmt.Errorf("vpid header: names %d:%d, want %v: %w",
			le.Uint32(b[vOffNode:]), le.Uint32(b[vOffVPID:]), want, fabric.ErrInvalid)
	case !validSlots(h.Slots):
		return vpidHeader{}, fmt.Errorf("vpid header: %d slots: %w", h.Slots, fabric.ErrInvalid)
	case !validDepth(h.Depth):
		return vpidHeader{}, fmt.Errorf("vpid header: notify depth %d: %w", h.Depth, fabric.ErrInvalid)
	case le.Uint32(b[vOffWaitMode:]) > waitBell:
		return vpidHeader{}, fmt.Errorf("vpid header: wait mode %d: %w", le.Uint32(b[vOffWaitMode:]), fabric.ErrInvalid)
	case int64(vpidFileSize(h.Slots, h.Depth)) > size:
		return vpidHeader{}, fmt.Errorf("vpid header: geometry needs %d bytes, file has %d: %w",
			vpidFileSize(h.Slots, h.Depth), size, fabric.ErrInvalid)
	}
	return h, nil
}

func encodeVPIDHeader(b []byte, h vpidHeader) {
	le := binary.LittleEndian
	le.PutUint64(b[vOffMagic:], vpidMagic)
	le.PutUint32(b[vOffVersion:], layoutVersion)
	le.PutUint32(b[vOffNode:], uint32(h.Addr.Node))
	le.PutUint32(b[vOffVPID:], uint32(h.Addr.VPID))
	le.PutUint32(b[vOffSlots:], uint32(h.Slots))
	le.PutUint32(b[vOffDepth:], uint32(h.Depth))
	mode := uint32(waitFutex)
	if h.Bell {
		mode = waitBell
	}
	le.PutUint32(b[vOffWaitMode:], mode)
	le.PutUint32(b[vOffState:], vpidOpen)
}

func validSlots(n int) bool { return n >= minSlots && n <= maxSlots && bits.OnesCount(uint(n)) == 1 }
func validDepth(n int) bool {
	return n >= minNotifyDepth && n <= maxNotifyDepth && bits.OnesCount(uint(n)) == 1
}

// Region table entry, word 0: gen<<32 | valid<<8 | owner VPID. Word 1: the
// registered size. The owner writes the size before it publishes word 0 and
// bumps gen on every reuse of an index, so readers use word 0 as a seqlock.
const regionValid = 1 << 8

type regionEntry struct {
	Gen   uint32
	Valid bool
	Owner fabric.VPID
	Size  uint64
}

// decodeRegionEntry validates a region table entry read from a peer.
func decodeRegionEntry(w0, size uint64) (regionEntry, error) {
	e := regionEntry{Gen: uint32(w0 >> 32), Valid: w0&regionValid != 0, Owner: fabric.VPID(w0), Size: size}
	if !e.Valid {
		return e, nil
	}
	switch {
	case w0&0xFFFFFE00 != 0:
		return regionEntry{}, fmt.Errorf("region entry: reserved bits %#x: %w", w0, fabric.ErrInvalid)
	case size == 0 || size > maxRegionBytes:
		return regionEntry{}, fmt.Errorf("region entry: size %d: %w", size, fabric.ErrInvalid)
	}
	return e, nil
}

func encodeRegionEntry(e regionEntry) uint64 {
	w := uint64(e.Gen)<<32 | uint64(e.Owner)
	if e.Valid {
		w |= regionValid
	}
	return w
}

// maxRegionBytes bounds one registration: 1 GiB is far above what EXT-Eth
// and EXT-DS register and far below fabric.MaxRegionSize.
const maxRegionBytes = 1 << 30
