package sys

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TUN/TAP device node and the TUNSETIFF request block.
const tunPath = "/dev/net/tun"

// EAGAIN is returned by TAPRead and TAPWrite when the non-blocking fd has
// nothing to read (or no room to write). Compare with ==.
var EAGAIN error = unix.EAGAIN

// EINTR is returned when a signal interrupted the call; retry it.
var EINTR error = unix.EINTR

// OpenTAP opens /dev/net/tun non-blocking and close-on-exec and attaches it
// to the TAP interface name with IFF_TAP|IFF_NO_PI: frames are plain
// Ethernet, with no packet-information header and no virtio-net header.
// The interface is created if absent and is not persistent, so it goes away
// when the last fd on it closes. It is created in the calling thread's
// network namespace. name must fit IFNAMSIZ-1 (15) bytes; "" lets the
// kernel choose. OpenTAP returns the fd, owned by the caller, and the name
// the kernel gave the interface. On error no fd is left open.
func OpenTAP(name string) (fd int, ifname string, err error) {
	return openTAP(name, unix.IFF_TAP|unix.IFF_NO_PI)
}

func openTAP(name string, flags uint16) (fd int, ifname string, err error) {
	if len(name) >= unix.IFNAMSIZ {
		return -1, "", fmt.Errorf("interface name %q longer than %d bytes: %w", name, unix.IFNAMSIZ-1, unix.EINVAL)
	}
	fd, err = unix.Open(tunPath, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("open %s: %w", tunPath, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("ifreq %q: %w", name, err)
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, "", fmt.Errorf("ioctl TUNSETIFF %q: %w", name, err)
	}
	return fd, ifr.Name(), nil
}

// TAPRead reads one frame from a non-blocking TAP fd into b. The kernel
// copies as much of a frame as fits and returns the copied length, so
// truncation is invisible to read(2); TAPRead therefore reads with readv
// into b and a one-byte spill, and n > len(b) means the frame was longer
// than b (it is consumed, and only len(b) bytes of it are in b). It
// returns EAGAIN when no frame is queued. It does not allocate.
//
// It is a RawSyscall, without the runtime's system-call bookkeeping: on a
// non-blocking fd the call never sleeps, so handing the processor off is
// pointless, and entering a system call while the runtime's monitor
// thread (sysmon) is parked wakes it — an extra thread wake-up per frame
// on an otherwise idle daemon, on a host with few cores. The fd must be
// non-blocking.
func TAPRead(fd int, b []byte) (n int, err error) {
	if len(b) == 0 {
		return 0, unix.EINVAL
	}
	var spill [1]byte
	iov := [2]unix.Iovec{iovec(b), iovec(spill[:])}
	return rawIOV(unix.SYS_READV, fd, iov[:])
}

// TAPWrite writes one frame to a non-blocking TAP fd; the kernel takes
// the whole frame or none of it. A RawSyscall, for the reasons of TAPRead.
func TAPWrite(fd int, b []byte) (n int, err error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return 0, errnoErr(e)
	}
	return int(r), nil
}

func errnoErr(e unix.Errno) error {
	switch e {
	case unix.EAGAIN:
		return EAGAIN
	case unix.EINTR:
		return EINTR
	}
	return e
}
