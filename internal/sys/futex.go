package sys

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Shared futex operations (no FUTEX_PRIVATE_FLAG): the word may live in
// memory that other processes map, and the kernel keys the wait queue on
// the backing inode and offset.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// FutexWait sleeps while *addr == val, for at most timeout (timeout <= 0
// means no limit). It returns nil when woken, when *addr != val on entry
// (EAGAIN), on a signal (EINTR) and on timeout: callers re-check their
// condition in a loop, so spurious returns are harmless. It never retains
// addr.
func FutexWait(addr *atomic.Uint32, val uint32, timeout time.Duration) error {
	var tsp unsafe.Pointer
	var ts unix.Timespec
	if timeout > 0 {
		ts = unix.NsecToTimespec(int64(timeout))
		tsp = unsafe.Pointer(&ts)
	}
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait,
		uintptr(val), uintptr(tsp), 0, 0)
	switch e {
	case 0, unix.EAGAIN, unix.EINTR, unix.ETIMEDOUT:
		return nil
	}
	return fmt.Errorf("futex wait: %w", e)
}

// FutexWake wakes up to n waiters on addr, in any process. It returns the
// number woken. It never blocks, so it is a RawSyscall: the runtime's
// system-call bookkeeping would only add cost, and wake its monitor thread
// (sysmon) when that is parked, on every doorbell.
func FutexWake(addr *atomic.Uint32, n int) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake,
		uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0, fmt.Errorf("futex wake: %w", e)
	}
	return int(r), nil
}

// errAlign is returned by the atomic views for a misaligned offset.
var errAlign = errors.New("sys: misaligned or out-of-range atomic offset")

// Uint64At returns an atomic view of the 8 bytes at b[off:]. off must be a
// multiple of 8 and b must be 8-byte aligned (mmap'd memory is page
// aligned). The view is valid while b stays mapped.
func Uint64At(b []byte, off int) (*atomic.Uint64, error) {
	if off < 0 || off+8 > len(b) || (uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(off))%8 != 0 {
		return nil, errAlign
	}
	return (*atomic.Uint64)(unsafe.Pointer(&b[off])), nil
}

// Uint32At returns an atomic view of the 4 bytes at b[off:], like Uint64At.
func Uint32At(b []byte, off int) (*atomic.Uint32, error) {
	if off < 0 || off+4 > len(b) || (uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(off))%4 != 0 {
		return nil, errAlign
	}
	return (*atomic.Uint32)(unsafe.Pointer(&b[off])), nil
}
