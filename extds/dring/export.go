package dring

// Views of a mapped buffer for a speaker of the protocol other than
// Endpoint: extds/rdirect's engine, which plays one side of a
// connection across hosts (docs/direct.md, "Across hosts"). They only
// name what layout.go defines; nothing here changes Endpoint.

import "sync/atomic"

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
