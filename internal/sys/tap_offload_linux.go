package sys

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// TUNSETOFFLOAD flags (include/uapi/linux/if_tun.h). x/sys/unix has the
// ioctl number but not these bits.
const (
	TunFCsum  = 0x01 // the reader takes frames with a partial checksum
	TunFTSO4  = 0x02 // ... and TCP/IPv4 super-frames
	TunFTSO6  = 0x04 // ... and TCP/IPv6 super-frames
	TunFTSOEC = 0x08 // ... with ECN (CWR in the first segment only)
	TunFUSO4  = 0x20 // ... and UDP/IPv4 super-frames (Linux 6.2)
	TunFUSO6  = 0x40 // ... and UDP/IPv6 super-frames (Linux 6.2)
)

// VnetHdrLen is the size of struct virtio_net_hdr, the header in front
// of every frame on a TAP opened with IFF_VNET_HDR (the kernel's default
// header size; num_buffers of the v1 header is not used).
const VnetHdrLen = 10

// OpenTAPVnet is OpenTAP with IFF_VNET_HDR: every read returns, and
// every write takes, a VnetHdrLen-byte virtio-net header before the
// frame. It then asks for offloads: checksum, TSO4/6 with ECN, and USO4/6
// where the kernel has them (an EINVAL for the USO bits retries without
// them). It returns the TUN_F_* bits the kernel took. On error no fd is
// left open.
func OpenTAPVnet(name string) (fd int, ifname string, offloads int, err error) {
	fd, ifname, err = openTAP(name, unix.IFF_TAP|unix.IFF_NO_PI|unix.IFF_VNET_HDR)
	if err != nil {
		return -1, "", 0, err
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, VnetHdrLen); err != nil {
		unix.Close(fd)
		return -1, "", 0, fmt.Errorf("ioctl TUNSETVNETHDRSZ %q: %w", ifname, err)
	}
	for _, off := range []int{
		TunFCsum | TunFTSO4 | TunFTSO6 | TunFTSOEC | TunFUSO4 | TunFUSO6,
		TunFCsum | TunFTSO4 | TunFTSO6 | TunFTSOEC,
	} {
		if err = unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, off); err == nil {
			return fd, ifname, off, nil
		}
	}
	unix.Close(fd)
	return -1, "", 0, fmt.Errorf("ioctl TUNSETOFFLOAD %q: %w", ifname, err)
}

// TAPReadVnet reads one frame and its virtio-net header from a
// non-blocking TAP fd opened by OpenTAPVnet: the header into hdr, the
// frame into b, with a one-byte spill as in TAPRead. n is the frame's
// length (without the header); n > len(b) means the frame was longer than
// b. A read shorter than the header is returned as n < 0. A RawSyscall,
// for the reasons of TAPRead. It does not allocate.
func TAPReadVnet(fd int, hdr *[VnetHdrLen]byte, b []byte) (n int, err error) {
	if len(b) == 0 {
		return 0, unix.EINVAL
	}
	var spill [1]byte
	iov := [3]unix.Iovec{iovec(hdr[:]), iovec(b), iovec(spill[:])}
	r, err := rawIOV(unix.SYS_READV, fd, iov[:])
	if err != nil {
		return 0, err
	}
	return r - VnetHdrLen, nil
}

// TAPWriteVnet writes one frame behind its virtio-net header to a
// non-blocking TAP fd opened by OpenTAPVnet, with one writev: the kernel
// takes the whole frame or none of it. A RawSyscall, for the reasons of
// TAPRead.
func TAPWriteVnet(fd int, hdr *[VnetHdrLen]byte, b []byte) (n int, err error) {
	iov := [2]unix.Iovec{iovec(hdr[:])}
	k := 1
	if len(b) > 0 {
		iov[1] = iovec(b)
		k = 2
	}
	r, err := rawIOV(unix.SYS_WRITEV, fd, iov[:k])
	if err != nil {
		return 0, err
	}
	return r - VnetHdrLen, nil
}
