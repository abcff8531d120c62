package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// TAPReadRaw is TAPRead without the runtime's system-call bookkeeping
// (RawSyscall): for a non-blocking fd the call never sleeps, so handing
// the processor off is pointless, and entering a system call while the
// runtime's monitor thread (sysmon) is parked wakes it — an extra thread
// wake-up per frame on an otherwise idle daemon, on a host with few
// cores. The fd must be non-blocking.
func TAPReadRaw(fd int, b []byte) (n int, err error) {
	if len(b) == 0 {
		return 0, unix.EINVAL
	}
	var spill [1]byte
	var iov [2]unix.Iovec
	iov[0].Base = &b[0]
	iov[0].SetLen(len(b))
	iov[1].Base = &spill[0]
	iov[1].SetLen(1)
	r, _, e := unix.RawSyscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), 2)
	if e != 0 {
		return 0, errnoErr(e)
	}
	return int(r), nil
}

// TAPWriteRaw is TAPWrite as a RawSyscall, for the reasons of
// TAPReadRaw. The fd must be non-blocking.
func TAPWriteRaw(fd int, b []byte) (n int, err error) {
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
