package rdirect

// The upgrade word across hosts (docs/shim.md, "Upgrade"; the bits in
// shim/upgrade.h and extds/dring's Upg constants). A connection that
// starts as the programs' own TCP connection and moves onto a direct
// one coordinates through the word at header +80 of its buffer. On one
// host both programs share it; across hosts each node's copy has its
// own, exnd marks it UpgXHost (extds/shimsrv/remote.go), and the engines
// join the two words here. The program is side L (Conn.side) and the
// engine plays P = 1−L in the local copy:
//
//   - send (pump.go): every CDC carries upg, L's bits of the local word,
//     and echo, P's bits of it (wire.go's nibbles); the pump sends one
//     whenever they differ from what it last sent (upgSent), cursors or
//     not, so a program that changes the word and rings its bell gets
//     a CDC out.
//   - receive (applyLocked, under rxMu): the peer's ATT, WSH, DET and REQ
//     are ORed in at P. A peer that asks (REQ, or MOV) is granted MOV(P)
//     unless the local program left (DET(L)): one CAS decides, against
//     the shim's exec, which sets DET(L) only while no MOV is set
//     (shim/upgrade.c, upg_exec), so the two never meet in a copy. The
//     peer's MOV itself is never copied: MOV(P) is only ever the grant.
//     An echo with MOV is the peer's grant of the local program's
//     request: MOV(L) is set if the local word has REQ(L), and without
//     it the grant is forged (ReasonUpgrade, a violation). A word that
//     changed rings the program (its parked parties look at the word
//     again) and kicks the pump (the peer must get the new bits).
//   - reset (Conn.resetLocked): UpgGone is set before the program is
//     rung, whatever the reason: a shim waiting for a grant stops.
//
// The shim changes the word by CAS from C at any time, and nobody
// clears a bit: every change here is an Or or a CAS loop. Bits only
// accrue, so two engines answering each other's changes settle within
// a few CDCs.

import (
	"github.com/exn-project/exn/extds/dring"
)

// nibBits pairs each nibble bit of a CDC (wire.go) with side 0's bit of
// the word; side s's is that << s.
var nibBits = [...]struct {
	nib  uint8
	word uint32
}{
	{nibAtt, dring.UpgAtt}, {nibMov, dring.UpgMov}, {nibWsh, dring.UpgWsh},
	{nibDet, dring.UpgDet}, {nibReq, dring.UpgReq},
}

// nibble is side s's bits of the word w, encoded for a CDC.
func nibble(w uint32, s int) uint8 {
	var n uint8
	for _, b := range nibBits {
		if w&(b.word<<s) != 0 {
			n |= b.nib
		}
	}
	return n
}

// wordBits is nibble n as side s's bits of the word.
func wordBits(n uint8, s int) uint32 {
	var w uint32
	for _, b := range nibBits {
		if n&b.nib != 0 {
			w |= b.word << s
		}
	}
	return w
}

// upgNow is what the next CDC carries of the local word: upg (the
// program's side) in the low byte, echo (the engine's side) in the high
// one.
func (c *Conn) upgNow() uint16 {
	w := c.upgW.Load()
	if w&^(dring.UpgXHost|dring.UpgGone) == 0 {
		return 0 // a connection that does not upgrade: every service asks
	}
	return uint16(nibble(w, c.side)) | uint16(nibble(w, 1-c.side))<<8
}

// forgedGrant reports whether echo grants the local program a move it
// never asked for (no REQ(L) in the local word).
func (c *Conn) forgedGrant(echo uint8) bool {
	if echo&nibMov == 0 {
		return false
	}
	w := c.upgW.Load()
	return w&(dring.UpgMov<<c.side) == 0 && w&(dring.UpgReq<<c.side) == 0
}

// upgradeLocked applies the peer's upg and echo to the local word (the
// file comment's receive rules; forgedGrant was checked) and reports
// whether it changed. The caller holds rxMu.
func (c *Conn) upgradeLocked(upg, echo uint8) bool {
	if upg == 0 && echo&nibMov == 0 {
		return false // a connection that does not upgrade
	}
	l, p := c.side, 1-c.side
	peer := wordBits(upg&^nibMov, p)
	ask := upg&(nibReq|nibMov) != 0
	granted := echo&nibMov != 0
	for {
		o := c.upgW.Load()
		n := o | peer
		if ask && o&(dring.UpgDet<<l) == 0 {
			n |= dring.UpgMov << p
		}
		if granted && o&(dring.UpgReq<<l) != 0 {
			n |= dring.UpgMov << l
		}
		if n == o || c.upgW.CompareAndSwap(o, n) {
			return n != o
		}
	}
}
