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
func TryLock(f *os.File, excl bool) (bool, error) {
	how := unix.LOCK_SH
	if excl {
		how = unix.LOCK_EX
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		switch err {
		case nil:
			return true, nil
		case unix.EWOULDBLOCK:
			return false, nil
		case unix.EINTR:
			continue
		}
		return false, fmt.Errorf("flock %s: %w", f.Name(), err)
	}
}

// Unlock drops f's flock.
func Unlock(f *os.File) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		return fmt.Errorf("flock unlock %s: %w", f.Name(), err)
	}
	return nil
}
