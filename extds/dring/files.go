package dring

// Making, opening and removing a direct connection's files in a shm
// directory (/dev/shm): the buffer NAME and the bells NAME.d0, NAME.s0,
// NAME.d1, NAME.s1 (data and space bells of sides 0 and 1), all 0600 and owned by exnd. Processes never open them by name: exnd
// hands them over as descriptors (SCM_RIGHTS), and the accepting exnd
// removes the names as soon as the connecting exnd has opened them.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// Files are one side's descriptors of a direct connection's files. The
// holder owns them; Close closes those still set.
type Files struct {
	Buf   *os.File    // the buffer, read-write
	Data  [2]*os.File // the data bells of side 0 and side 1, read-write, O_NONBLOCK
	Space [2]*os.File // the space bells of side 0 and side 1, likewise
}

// bellNames are the suffixes of the bells, in the order of Files.bells.
var bellNames = [4]string{".d0", ".d1", ".s0", ".s1"}

// bells are pointers to the four bell slots, in bellNames' order.
func (fs *Files) bells() [4]**os.File {
	return [4]**os.File{&fs.Data[0], &fs.Data[1], &fs.Space[0], &fs.Space[1]}
}

// Name is the base name of connection id's files on fabric fab, made by
// node: unique per fabric while id is unique per node.
func Name(fab string, node fabric.NodeID, id uint64) string {
	return fmt.Sprintf("exn-%s-d%d-%x", fab, node, id)
}

// Create makes the files of a new connection in dir with rings of ring
// bytes and opens them. It fails if any exists.
func Create(dir, name string, ring int) (_ *Files, err error) {
	if err := CheckRing(ring); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name)
	fs := &Files{}
	defer func() {
		if err != nil {
			fs.Close()
			Remove(dir, name)
		}
	}()
	fs.Buf, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create direct buffer: %w", err)
	}
	if err := fs.Buf.Truncate(int64(FileSize(ring))); err != nil {
		return nil, fmt.Errorf("size direct buffer: %w", err)
	}
	mem, err := sys.MapShared(fs.Buf, HeaderSize)
	if err != nil {
		return nil, err
	}
	initHeader(mem, ring)
	if err := sys.Unmap(mem); err != nil {
		return nil, err
	}
	for i, b := range fs.bells() {
		bp := path + bellNames[i]
		if err := sys.Mkfifo(bp, 0o600); err != nil {
			return nil, err
		}
		if *b, err = openBell(bp); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// Open opens the files another exnd made.
func Open(dir, name string) (_ *Files, err error) {
	path := filepath.Join(dir, name)
	fs := &Files{}
	defer func() {
		if err != nil {
			fs.Close()
		}
	}()
	fs.Buf, err = os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open direct buffer: %w", err)
	}
	for i, b := range fs.bells() {
		if *b, err = openBell(path + bellNames[i]); err != nil {
			return nil, err
		}
	}
	return fs, nil
}

// openBell opens a FIFO read-write, close-on-exec, as an *os.File that
// is NOT in Go's netpoller, then makes the open file description
// non-blocking. Every ring of a bell registered in a netpoller wakes that
// process's poller thread, whether or not a goroutine waits on it, and
// exnd keeps these descriptors only to hand them over and to ring them;
// an Endpoint that must park registers a descriptor of its own (waiter).
// Opening a FIFO read-write never blocks and never leaves it readerless.
func openBell(path string) (*os.File, error) {
	for {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open bell %s: %w", path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			unix.Close(fd)
			return nil, fmt.Errorf("open bell %s: not a fifo (%v)", path, err)
		}
		f := os.NewFile(uintptr(fd), path) // blocking here: not registered
		if err := unix.SetNonblock(fd, true); err != nil {
			f.Close()
			return nil, fmt.Errorf("open bell %s: %w", path, err)
		}
		return f, nil
	}
}

// Remove unlinks a connection's names in dir (those that exist).
func Remove(dir, name string) error {
	path := filepath.Join(dir, name)
	var errs []error
	for _, p := range []string{path, path + bellNames[0], path + bellNames[1], path + bellNames[2], path + bellNames[3]} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close closes the files still set.
func (fs *Files) Close() error {
	var errs []error
	if fs.Buf != nil {
		errs = append(errs, fs.Buf.Close())
		fs.Buf = nil
	}
	for _, b := range fs.bells() {
		if *b != nil {
			errs = append(errs, (*b).Close())
			*b = nil
		}
	}
	return errors.Join(errs...)
}
