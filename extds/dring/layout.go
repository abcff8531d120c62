package dring

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout version 4 (docs/direct.md, "The connection buffer"): version 2
// (version 1 and the rung flags), the pwait words of the one-bell
// protocol (version 3), which only the C shim writes, and prod_lock's
// fourth value, lockReclaim (version 4, reclaim.go).
const (
	Magic   = 0x44445845 // "EXDD" little-endian
	Version = 4

	// HeaderSize is the page before the two rings.
	HeaderSize = 4096
	// MinRing and MaxRing bound the ring size per direction (a power of
	// two), as extds bounds its rings.
	MinRing = 4 << 10
	MaxRing = 64 << 20
	// DefaultRing: 1 MiB per direction keeps a single stream's writer
	// from waiting on its reader at iperf3 rates (docs/direct.md) while
	// a connection costs 2 MiB of tmpfs, touched lazily.
	DefaultRing = 1 << 20

	offMagic   = 0
	offVersion = 4
	offRing    = 8
	offSize    = 16
	offRelay   = 64 // + 4·side
	// offPwait + 4·side: pwait[side], how many waiters and epoll
	// records of that side's processes park on its bell now. Written
	// and read by the shim (C) only, to know when a drain must kick
	// another process (shim/dparty.c); Go reserves the words and never
	// touches them.
	offPwait = 72
	// offUpgrade: the upgrade word of a connection that moves onto this
	// buffer in the middle of its stream (shim/upgrade.h: which sides
	// attached, asked, moved, ended on TCP or left; its bits are the
	// Upg constants, export.go). On one host both shims share it. Across
	// hosts each node's copy has its own, and exnd writes it too: it
	// sets UpgXHost before the program gets the buffer
	// (extds/shimsrv/remote.go), and the engine carries each side's bits
	// to the peer's copy, grants the moves and sets UpgGone when it
	// resets (extds/rdirect/upgrade.go). Every buffer starts with it 0
	// (Create makes a new file for each connection).
	offUpgrade = 80

	ctlBase = 1024 // control block of direction d at ctlBase + ctlSize·d
	ctlSize = 1024

	cTail      = 0
	cFin       = 8
	cProdWait  = 12
	cProdLock  = 16
	cRst       = 20
	cDataRung  = 24 // the producer rang the consumer's side for data; cleared by the consumer's side after draining its bell
	cHead      = 128
	cConsWait  = 136
	cConsLock  = 140
	cRdClosed  = 144
	cSpaceRung = 148 // the consumer rang the producer's side for space; cleared by the producer's side after draining its bell
)

// ErrCorrupt: a buffer's header or cursors break the layout's invariants
// (forged or damaged by the other side).
var ErrCorrupt = errors.New("dring: corrupt connection buffer")

// FileSize is the size of a buffer whose rings hold ring bytes each.
func FileSize(ring int) int { return HeaderSize + 2*ring }

// CheckRing reports whether ring is a valid ring size.
func CheckRing(ring int) error {
	if ring < MinRing || ring > MaxRing || ring&(ring-1) != 0 {
		return fmt.Errorf("ring size %d: want a power of two in %d..%d", ring, MinRing, MaxRing)
	}
	return nil
}

// initHeader writes a fresh header into mem (zeroed, of FileSize(ring)).
func initHeader(mem []byte, ring int) {
	binary.LittleEndian.PutUint32(mem[offMagic:], Magic)
	binary.LittleEndian.PutUint32(mem[offVersion:], Version)
	binary.LittleEndian.PutUint32(mem[offRing:], uint32(ring))
	binary.LittleEndian.PutUint64(mem[offSize:], uint64(FileSize(ring)))
}

// checkHeader validates a mapped header against the file's real size and
// returns the ring size.
func checkHeader(mem []byte, fileSize int64) (int, error) {
	if len(mem) < HeaderSize {
		return 0, fmt.Errorf("%d bytes: %w", len(mem), ErrCorrupt)
	}
	if m := binary.LittleEndian.Uint32(mem[offMagic:]); m != Magic {
		return 0, fmt.Errorf("magic %#x: %w", m, ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(mem[offVersion:]); v != Version {
		return 0, fmt.Errorf("layout version %d, want %d: %w", v, Version, ErrCorrupt)
	}
	ring := int(binary.LittleEndian.Uint32(mem[offRing:]))
	if err := CheckRing(ring); err != nil {
		return 0, fmt.Errorf("%v: %w", err, ErrCorrupt)
	}
	if sz := binary.LittleEndian.Uint64(mem[offSize:]); sz != uint64(FileSize(ring)) || fileSize != int64(FileSize(ring)) {
		return 0, fmt.Errorf("size %d (file %d), want %d: %w", sz, fileSize, FileSize(ring), ErrCorrupt)
	}
	return ring, nil
}
