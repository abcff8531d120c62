package dring

// Views of a mapped buffer for a speaker of the protocol other than
// Endpoint: extds/rdirect's engine, which plays one side of a
// connection across hosts (docs/direct.md, "Across hosts"), and for the
// upgrade word also extds/shimsrv, which marks a cross-host copy. They
// only name what layout.go defines; nothing here changes Endpoint.

import (
	"fmt"
	"sync/atomic"

	"github.com/exn-project/exn/internal/sys"
)

// Control is an atomic view of one direction's control block (docs/direct.md,
// "The connection buffer"). It is valid while the buffer stays mapped.
type Control struct {
	Tail, Head                   *atomic.Uint64
	Fin, ProdWait, ProdLock, Rst *atomic.Uint32
	ConsWait, ConsLock, RdClosed *atomic.Uint32
	DataRung, SpaceRung          *atomic.Uint32 // the rung flags (docs/direct.md, "Wake-up protocol")
}

// ControlOf returns the view of direction d's (0 or 1) control block in
// mem, a mapping of a whole buffer.
func ControlOf(mem []byte, d int) (Control, error) {
	if d != 0 && d != 1 {
		return Control{}, ErrCorrupt
	}
	c, err := ctlAt(mem, d)
	if err != nil {
		return Control{}, err
	}
	return Control{
		Tail: c.tail, Head: c.head,
		Fin: c.fin, ProdWait: c.prodWait, ProdLock: c.prodLock, Rst: c.rst,
		ConsWait: c.consWait, ConsLock: c.consLock, RdClosed: c.rdClosed,
		DataRung: c.dataRung, SpaceRung: c.spaceRung,
	}, nil
}

// CheckMapped checks the header of mem, a mapping of a whole buffer
// (len(mem) is the file's size), and returns the ring size.
func CheckMapped(mem []byte) (int, error) { return checkHeader(mem, int64(len(mem))) }

// DataOffset is the offset of direction d's ring in a buffer whose rings
// hold ring bytes: byte i of the direction's stream is at
// DataOffset(ring, d) + i mod ring.
func DataOffset(ring, d int) int { return HeaderSize + d*ring }

// The bits of the upgrade word (header +80; shim/upgrade.h, UPG_*): the
// per-side ones are side 0's, and side s's is the constant << s (UpgAtt<<1
// is UPG_ATT(1)). The shim changes the word by CAS only and never clears
// a bit; across hosts exnd's engine joins the two copies
// (extds/rdirect/upgrade.go).
const (
	UpgAtt uint32 = 1 << 0 // UPG_ATT(s): side s attached the buffer
	UpgMov uint32 = 1 << 2 // UPG_MOV(s): side s writes into the buffer from now on
	UpgWsh uint32 = 1 << 4 // UPG_WSH(s): side s's program shut its TCP write side itself
	UpgDet uint32 = 1 << 6 // UPG_DET(s): side s left before anything moved (exec)
	UpgReq uint32 = 1 << 8 // UPG_REQ(s): across hosts, side s asks to move (its peer's engine grants UpgMov)

	// UpgXHost (UPG_XHOST): exnd set it before the program got the
	// buffer: the buffer is one node's copy and the engine is the peer
	// side, so the shim asks with UpgReq instead of setting UpgMov.
	UpgXHost uint32 = 1 << 10
	// UpgGone (UPG_GONE): the engine reset the connection; set before
	// it rings the program.
	UpgGone uint32 = 1 << 11
)

// UpgradeWord returns the upgrade word of mem, a mapping of a whole
// buffer, as an atomic (valid while the buffer stays mapped).
func UpgradeWord(mem []byte) (*atomic.Uint32, error) {
	if len(mem) < HeaderSize {
		return nil, fmt.Errorf("%d bytes: %w", len(mem), ErrCorrupt)
	}
	w, err := sys.Uint32At(mem, offUpgrade)
	if err != nil {
		return nil, fmt.Errorf("upgrade word: %w", err)
	}
	return w, nil
}
