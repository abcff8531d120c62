package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// TryLock takes a non-blocking flock on f: exclusive if excl, else shared.
// It returns false, nil if another open file description holds a
// conflicting lock. flock locks belong to the open file description, so two
// opens of one file in the same process conflict too, and the kernel drops
// them when the last descriptor closes — including when the holder is
// SIGKILLed. That is what fabric/shm's liveness rests on.
//
// It is a raw system call: with LOCK_NB flock never sleeps, and fabric/shm
// probes peers' locks every liveness period, where entering the runtime's
// system-call path would wake a parked sysmon each time. It reaches the
// descriptor through SyscallConn, not f.Fd() (which would switch a
// pollable file to blocking mode), and holds it against a concurrent
// Close for the call.
func TryLock(f *os.File, excl bool) (bool, error) {
	how := unix.LOCK_SH
	if excl {
		how = unix.LOCK_EX
	}
	var e unix.Errno
	if err := control(f, func(fd uintptr) {
		for {
			_, _, e = unix.RawSyscall(unix.SYS_FLOCK, fd, uintptr(how|unix.LOCK_NB), 0)
			if e != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return false, fmt.Errorf("flock %s: %w", f.Name(), err)
	}
	switch e {
	case 0:
		return true, nil
	case unix.EWOULDBLOCK:
		return false, nil
	}
	return false, fmt.Errorf("flock %s: %w", f.Name(), e)
}

// Unlock drops f's flock (a raw system call: LOCK_UN never sleeps).
func Unlock(f *os.File) error {
	var e unix.Errno
	if err := control(f, func(fd uintptr) {
		_, _, e = unix.RawSyscall(unix.SYS_FLOCK, fd, unix.LOCK_UN, 0)
	}); err != nil {
		return fmt.Errorf("flock unlock %s: %w", f.Name(), err)
	}
	if e != 0 {
		return fmt.Errorf("flock unlock %s: %w", f.Name(), e)
	}
	return nil
}

// control runs fn with f's descriptor, which stays open for the call.
func control(f *os.File, fn func(fd uintptr)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(fn)
}
