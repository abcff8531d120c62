package vnet

import "encoding/binary"

// Header flags and GSO types (virtio_net.h).
const (
	NeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM: the pseudo-header sum is in place
	DataValid = 2 // VIRTIO_NET_HDR_F_DATA_VALID: the checksum was verified

	GSONone  = 0
	GSOTCPv4 = 1
	GSOTCPv6 = 4
	GSOUDPL4 = 5
	GSOECN   = 0x80
)

// MaxGSOFrame is the largest super-frame carried with a header: the
// kernel's legacy GSO limit (64 KiB, GSO_LEGACY_MAX_SIZE) plus room for
// the Ethernet header, rounded to the 64-byte slot granule.
const MaxGSOFrame = 64<<10 + 64

// CsumAdd adds b to a ones' complement sum (not folded).
func CsumAdd(sum uint32, b []byte) uint32 {
	n := len(b) &^ 1
	for i := 0; i < n; i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)&1 != 0 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

// CsumFold folds a ones' complement sum to 16 bits.
func CsumFold(sum uint32) uint16 {
	for sum > 0xFFFF {
		sum = sum>>16 + sum&0xFFFF
	}
	return uint16(sum)
}

// CompleteCsum finishes a needs-checksum frame in place, as the kernel's
// skb_checksum_help does: the field at start+offset holds the
// pseudo-header sum, the bytes from start to the end of f are summed over
// it, and the complement replaces it (0 is sent as 0xFFFF). The caller
// has checked that start+offset+2 <= len(f).
func CompleteCsum(f []byte, start, offset int) {
	c := ^CsumFold(CsumAdd(0, f[start:]))
	if c == 0 {
		c = 0xFFFF
	}
	binary.BigEndian.PutUint16(f[start+offset:], c)
}
