package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// iovec describes b, which must not be empty, for readv and writev.
func iovec(b []byte) unix.Iovec {
	v := unix.Iovec{Base: &b[0]}
	v.SetLen(len(b))
	return v
}

// rawIOV makes one readv or writev (trap) on fd over iov, as a RawSyscall
// (TAPRead says why), and returns the bytes moved. iov must not be empty.
func rawIOV(trap uintptr, fd int, iov []unix.Iovec) (int, error) {
	r, _, e := unix.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	if e != 0 {
		return 0, errnoErr(e)
	}
	return int(r), nil
}
