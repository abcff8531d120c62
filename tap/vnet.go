package tap

// The virtio-net header of a TAP opened with Config.Offload
// (IFF_VNET_HDR): what it means, and the frames that carry one.
//
//	kernel ── readv(header, frame buffer, spill) ── header decoded
//	   │ ReadVnet: frame and header to the caller (exnd's reader, which
//	   │           hands both to the engine: exn.Offload)
//	   └ Read:     a partial checksum completed here, a super-frame
//	               dropped and counted (GSODropped)
//	caller ── WriteVnet(frames, headers) / Write (zero header: complete
//	          frame) ── writev(header, frame) ── kernel, which checks the
//	          header again (virtio_net_hdr_to_skb) and counts a refusal
//
// A frame whose header is shorter than VnetHdrLen, or has flags or a GSO
// type this package does not know, is dropped and counted (BadVnet). The
// read and write ops own a scratch header each, under readMu / writeMu.

import (
	"encoding/binary"

	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/internal/vnet"
)

// VnetHdr is struct virtio_net_hdr (include/uapi/linux/virtio_net.h),
// little-endian on the wire as the kernel's TAP uses it on this host. It
// converts to and from exn.Offload, which has the same fields.
type VnetHdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
}

// OffloadDevice is a Device that passes the virtio-net header (a TAP
// opened with Config.Offload).
type OffloadDevice interface {
	Device
	// ReadVnet is Read that also returns each frame's header in hdrs[i]:
	// a frame may need its checksum completed (vnet.NeedsCsum) or be a
	// super-frame of up to vnet.MaxGSOFrame bytes (GSOType), which buffers
	// must hold. It reads at most len(hdrs) frames.
	ReadVnet(bufs [][]byte, sizes []int, hdrs []VnetHdr) (int, error)
	// WriteVnet is Write with a header per frame (hdrs[i] for
	// frames[i]; at most len(hdrs) frames). A super-frame may be up to
	// vnet.MaxGSOFrame bytes. The kernel checks the header and refuses a bad
	// one (the frame is counted in TxErrors and skipped as in Write).
	WriteVnet(frames [][]byte, hdrs []VnetHdr) (int, error)
	// Offloads is the TUN_F_* bits the kernel took at Open.
	Offloads() int
}

var _ OffloadDevice = (*TAP)(nil)

// ReadVnet implements OffloadDevice. On a TAP opened without Offload the
// headers come back zero.
func (t *TAP) ReadVnet(bufs [][]byte, sizes []int, hdrs []VnetHdr) (int, error) {
	if hdrs == nil {
		hdrs = []VnetHdr{}
	}
	n, err := t.read(bufs, sizes, hdrs)
	if t.vnet == 0 {
		clear(hdrs[:n])
	}
	return n, err
}

// WriteVnet implements OffloadDevice. On a TAP opened without Offload a
// frame with a non-zero header is refused.
func (t *TAP) WriteVnet(frames [][]byte, hdrs []VnetHdr) (int, error) {
	if hdrs == nil {
		hdrs = []VnetHdr{}
	}
	return t.write(frames, hdrs)
}

// Offloads implements OffloadDevice.
func (t *TAP) Offloads() int { return t.vnet }

// decode reads a header in the kernel's layout.
func (h *VnetHdr) decode(b *[sys.VnetHdrLen]byte) {
	*h = VnetHdr{
		Flags: b[0], GSOType: b[1],
		HdrLen:     binary.LittleEndian.Uint16(b[2:4]),
		GSOSize:    binary.LittleEndian.Uint16(b[4:6]),
		CsumStart:  binary.LittleEndian.Uint16(b[6:8]),
		CsumOffset: binary.LittleEndian.Uint16(b[8:10]),
	}
}

// encode writes a header in the kernel's layout.
func (h *VnetHdr) encode(b *[sys.VnetHdrLen]byte) {
	b[0], b[1] = h.Flags, h.GSOType
	binary.LittleEndian.PutUint16(b[2:4], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:6], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:8], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:10], h.CsumOffset)
}

// known reports whether h has only flags and GSO types this package
// knows, with a checksum window inside a frame of n bytes.
func (h *VnetHdr) known(n int) bool {
	if h.Flags&^(vnet.NeedsCsum|vnet.DataValid) != 0 {
		return false
	}
	switch h.GSOType &^ vnet.GSOECN {
	case vnet.GSONone, vnet.GSOTCPv4, vnet.GSOTCPv6, vnet.GSOUDPL4:
	default:
		return false
	}
	return h.Flags&vnet.NeedsCsum == 0 || int(h.CsumStart)+int(h.CsumOffset)+2 <= n
}

// header handles the header read with frame f (n bytes, n ≤ len(f));
// false drops the frame (counted). Run under readMu.
func (r *readOp) header(f []byte, n int) bool {
	if n < 0 {
		r.bad++ // shorter than the header
		return false
	}
	var h VnetHdr
	h.decode(&r.hdr)
	if !h.known(n) {
		r.bad++
		return false
	}
	if r.hdrs != nil {
		r.hdrs[r.n] = h
		return true
	}
	if h.GSOType != vnet.GSONone {
		r.gso++
		return false
	}
	if h.Flags&vnet.NeedsCsum != 0 {
		vnet.CompleteCsum(f[:n], int(h.CsumStart), int(h.CsumOffset))
	}
	return true
}
