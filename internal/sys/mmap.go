package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MapShared maps the first size bytes of f read-write and MAP_SHARED. The
// mapping outlives f's descriptor; release it with Unmap. The caller must
// have sized the file (a read past its end raises SIGBUS).
func MapShared(f *os.File, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("mmap %s: size %d", f.Name(), size)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	return b, nil
}

// Unmap releases a mapping returned by MapShared. Unmap(nil) is a no-op.
func Unmap(b []byte) error {
	if b == nil {
		return nil
	}
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}

// FileSize returns f's size from fstat.
func FileSize(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	return st.Size, nil
}

// SameFile reports whether f is still the file at path (same device and
// inode), so a caller holding a lock on f knows path was not replaced.
func SameFile(f *os.File, path string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return false, fmt.Errorf("fstat %s: %w", f.Name(), err)
	}
	if err := unix.Stat(path, &b); err != nil {
		if err == unix.ENOENT {
			return false, nil
		}
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}
