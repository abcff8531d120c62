package sys

import (
	"fmt"
	"os"
	"unsafe"

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

// RemovePages frees the backing store of b, a page-aligned part of a
// MAP_SHARED mapping of a tmpfs file (madvise MADV_REMOVE: a hole is
// punched in the file), so its pages count against /dev/shm no more; a
// later access faults in a zero page. The caller must know that nobody
// else writes b meanwhile.
func RemovePages(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.Madvise(b, unix.MADV_REMOVE); err != nil {
		return fmt.Errorf("madvise remove: %w", err)
	}
	return nil
}

// ResidentPages counts the pages of b, a page-aligned part of a mapping,
// that are in memory now (mincore): for a shared file mapping, the
// file's pages that exist in the page cache or tmpfs.
func ResidentPages(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	ps := os.Getpagesize()
	vec := make([]byte, (len(b)+ps-1)/ps)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
	if e != 0 {
		return 0, fmt.Errorf("mincore: %w", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n, nil
}
