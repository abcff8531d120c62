package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// FDRoom reports how many descriptor numbers this process has left below
// its soft RLIMIT_NOFILE: the limit less the lowest free number (found by
// taking the lowest free number, a dup of a standard descriptor or an
// O_PATH open of "/", and closing it again; the kernel hands out the
// lowest free number, so the table is dense and the lowest free number is
// close to the count of open descriptors, less the holes that closed
// descriptors left). 0 when none is free. limit is the soft limit (1<<30
// for none). Safe for concurrent use; the answer is a snapshot.
func FDRoom() (room, limit int, err error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, fmt.Errorf("getrlimit: %w", err)
	}
	limit = 1 << 30
	if rl.Cur != unix.RLIM_INFINITY && rl.Cur < 1<<30 {
		limit = int(rl.Cur)
	}
	fd := -1
	err = unix.EBADF
	for std := 0; std < 3 && err == unix.EBADF; std++ {
		fd, err = unix.FcntlInt(uintptr(std), unix.F_DUPFD_CLOEXEC, 0)
	}
	if err == unix.EBADF {
		fd, err = unix.Open("/", unix.O_PATH|unix.O_CLOEXEC, 0)
	}
	if err == unix.EMFILE || err == unix.ENFILE {
		return 0, limit, nil
	}
	if err != nil {
		return 0, limit, fmt.Errorf("probe a descriptor number: %w", err)
	}
	unix.Close(fd)
	return max(limit-fd, 0), limit, nil
}

// FileFD is f's descriptor, without touching its mode (f.Fd() would make
// a non-blocking descriptor blocking); valid while f is open.
func FileFD(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	if err := rc.Control(func(d uintptr) { fd = int(d) }); err != nil {
		return -1, err
	}
	return fd, nil
}
