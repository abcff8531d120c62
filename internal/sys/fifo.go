package sys

// Doorbell FIFOs for fabric/shm. A consumer that sleeps parks its
// goroutine in the Go netpoller on a FIFO it owns (OpenBell) instead of
// sitting in a blocking FUTEX_WAIT; producers in any process, in any
// network namespace, wake it by writing one byte (RingBell). Every call
// here that touches a bell's descriptor is a raw system call: none of
// them can block (the descriptors are O_NONBLOCK), and the runtime's
// system-call bookkeeping (entersyscall) would wake a parked sysmon on
// every ring and every drain.

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotPollable is returned by OpenBell when the runtime could not
// register the FIFO with its netpoller.
var ErrNotPollable = errors.New("not pollable by the netpoller")

// Mkfifo creates a FIFO at path with permission bits perm (subject to the
// umask). It fails if path exists.
func Mkfifo(path string, perm uint32) error {
	for {
		err := unix.Mkfifo(path, perm)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("mkfifo %s: %w", path, err)
		}
		return nil
	}
}

// OpenBell opens the FIFO at path for reading and writing, non-blocking
// and close-on-exec, as an *os.File registered with the netpoller, and
// returns it with its descriptor for RingBell and DrainBell. Opening a
// FIFO read-write never blocks and never leaves it without a reader. It
// refuses anything that is not a FIFO (ErrInvalid-like error) and a file
// the netpoller cannot watch (ErrNotPollable). The caller owns the file;
// fd is valid until the file is closed, and the caller must not use
// f.Fd() (it would make the descriptor blocking).
func OpenBell(path string) (f *os.File, fd int, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open bell: %w", err)
	}
	fail := func(err error) (*os.File, int, error) {
		f.Close()
		return nil, -1, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return fail(fmt.Errorf("open bell %s: %w", path, err))
	}
	fd = -1
	var st unix.Stat_t
	var serr error
	if err := rc.Control(func(d uintptr) {
		fd = int(d)
		serr = unix.Fstat(fd, &st)
	}); err != nil {
		return fail(fmt.Errorf("open bell %s: %w", path, err))
	}
	if serr != nil {
		return fail(fmt.Errorf("fstat bell %s: %w", path, serr))
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return fail(fmt.Errorf("open bell %s: mode %#o is not a fifo", path, st.Mode))
	}
	// SetReadDeadline fails with ErrNoDeadline on a file the netpoller
	// does not watch: then a RawConn.Read would block the thread.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		return fail(fmt.Errorf("open bell %s: %w: %v", path, ErrNotPollable, err))
	}
	return f, fd, nil
}

// OpenBellWriter opens the FIFO at path for a producer that rings it. It
// opens it read-write, not write-only: a FIFO with a reader never fails a
// write with EPIPE (and never raises SIGPIPE), even after the consumer
// died, and the open never fails with ENXIO. The descriptor is
// non-blocking and close-on-exec; close it with CloseFD.
func OpenBellWriter(path string) (int, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("open bell %s: %w", path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			unix.Close(fd)
			return -1, fmt.Errorf("open bell %s: not a fifo (%v)", path, err)
		}
		return fd, nil
	}
}

// RingBell writes one byte to the bell fd. A full FIFO (EAGAIN) already
// holds a ring, so it counts as success. It never blocks and does not
// allocate.
func RingBell(fd int) error {
	b := byte(1)
	for {
		_, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b)), 1)
		switch e {
		case 0, unix.EAGAIN:
			return nil
		case unix.EINTR:
			continue
		}
		return fmt.Errorf("ring bell: %w", e)
	}
}

// DrainBell reads what the bell fd holds into buf, repeatedly while
// reads fill buf, and returns how many bytes it consumed. An empty FIFO
// is n == 0, err == nil. It never blocks and does not allocate.
func DrainBell(fd int, buf []byte) (n int, err error) {
	if len(buf) == 0 {
		return 0, errors.New("drain bell: empty buffer")
	}
	for {
		r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		switch e {
		case 0:
			n += int(r)
			if int(r) < len(buf) {
				return n, nil
			}
			continue
		case unix.EAGAIN:
			return n, nil
		case unix.EINTR:
			continue
		}
		return n, fmt.Errorf("drain bell: %w", e)
	}
}

// CloseFD closes a descriptor from OpenBellWriter.
func CloseFD(fd int) error {
	if err := unix.Close(fd); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
