package vnet

import (
	"encoding/binary"
	"testing"
)

// TestCompleteCsum: after completion, the pseudo-header sum plus every
// covered byte (checksum field included) folds to all ones, which is the
// receiver's check, at even and odd lengths; the fold is a ones'
// complement fold.
func TestCompleteCsum(t *testing.T) {
	for _, n := range []int{8, 9, 20, 1001} {
		f := make([]byte, 4+n)
		for i := range f {
			f[i] = byte(i*7 + n)
		}
		const start, offset = 4, 2
		pseudo := CsumFold(CsumAdd(0, []byte{10, 0, 0, 1, 10, 0, 0, 2, 0, 17, 0, byte(n)}))
		binary.BigEndian.PutUint16(f[start+offset:], pseudo)
		CompleteCsum(f, start, offset)
		if got := CsumFold(CsumAdd(uint32(pseudo), f[start:])); got != 0xFFFF {
			t.Errorf("%d bytes: receiver's sum %#x, want 0xffff", n, got)
		}
		if binary.BigEndian.Uint16(f[start+offset:]) == 0 {
			t.Errorf("%d bytes: checksum sent as 0", n)
		}
	}
	if CsumFold(0x1FFFE) != 0xFFFF || CsumFold(0x10001) != 2 {
		t.Fatalf("fold: %#x %#x", CsumFold(0x1FFFE), CsumFold(0x10001))
	}
}
