package dring

// Making, opening and removing a direct connection's files in a shm
// directory (/dev/shm), and its bells (docs/direct.md, "One bell per
// side"). The buffer is NAME; the bells are the two ends of a connected
// AF_UNIX SOCK_STREAM pair, B_0 for side 0 and B_1 for side 1. On one
// host the two ends live in two exnds, and the pair is made by
// connect/accept: the accepting exnd (side 1) makes, with the buffer, a
// listening socket bound at NAME.b (Create); the connecting exnd opens
// NAME and connects to NAME.b, which is B_0 (Open); on the client's
// COMMIT the accepting exnd accepts, which is B_1 (Files.Accept), and
// removes both names (Remove). All names are 0600 and owned by exnd, and
// programs never open them: exnd hands the buffer and a side's bell over
// as descriptors (SCM_RIGHTS). Across hosts and in tests both bells come
// from a socketpair (NewBells, CreatePair).
//
// Bells are non-blocking, close-on-exec and out of Go's netpoller
// (internal/sys, sockbell_linux.go): every ring of a bell registered in
// a netpoller wakes that process's poller thread, whether or not a
// goroutine waits on it, and exnd keeps its bells mostly to hand them
// over and to ring them. An Endpoint that must park registers a dup of
// its own (endpoint.go, register).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/sys"
)

// bellSuffix names the listener of a buffer's bells: NAME.b.
const bellSuffix = ".b"

// Files are one holder's descriptors of a direct connection: the buffer
// and the bells of the sides it holds (Bell[s] is side s's bell, nil
// where this holder has none), and, for the creator until Accept, the
// listener at NAME.b. The holder owns them; Close closes those still
// set. A holder may move Buf and Bell out (setting them nil) to hand
// them on; the listener stays with the Files.
type Files struct {
	Buf  *os.File    // the buffer, read-write
	Bell [2]*os.File // side s's bell, non-blocking, out of the netpoller
	ln   *os.File    // Create's listener at NAME.b, until Accept or Close
}

// Name is the base name of connection id's files on fabric fab, made by
// node: unique per fabric while id is unique per node.
func Name(fab string, node fabric.NodeID, id uint64) string {
	return fmt.Sprintf("exn-%s-d%d-%x", fab, node, id)
}

// Create makes the files of a new connection in dir with rings of ring
// bytes: the buffer NAME, opened, and a listener at NAME.b (backlog 1)
// whose connection Accept takes as side 1's bell. It fails if either
// name exists.
func Create(dir, name string, ring int) (_ *Files, err error) {
	fs, err := CreateBuffer(dir, name, ring)
	if err != nil {
		return nil, err
	}
	if fs.ln, err = sys.ListenSocketBell(filepath.Join(dir, name+bellSuffix), 1); err != nil {
		fs.Close()
		os.Remove(filepath.Join(dir, name)) // ours; NAME.b is not (bind failed)
		return nil, fmt.Errorf("direct bell: %w", err)
	}
	return fs, nil
}

// CreateBuffer makes and opens the buffer NAME in dir only, with rings
// of ring bytes (no listener, no bells). It fails if the name exists.
func CreateBuffer(dir, name string, ring int) (_ *Files, err error) {
	if err := CheckRing(ring); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, name)
	fs := &Files{}
	fs.Buf, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create direct buffer: %w", err) // not ours: nothing to remove
	}
	defer func() {
		if err != nil {
			fs.Close()
			os.Remove(path)
		}
	}()
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
	return fs, nil
}

// Open opens the buffer another exnd made with Create and connects to
// its listener: Bell[0] is side 0's bell. It does not wait for the
// accept (the listener's backlog has room for it; a full one fails).
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
	if fs.Bell[0], err = sys.ConnectSocketBell(path + bellSuffix); err != nil {
		return nil, fmt.Errorf("direct bell: %w", err)
	}
	return fs, nil
}

// Listening reports whether fs holds Create's listener (not yet
// accepted or closed).
func (fs *Files) Listening() bool { return fs.ln != nil }

// Accept takes the connection Open queued on Create's listener as side
// 1's bell (Bell[1]) and closes the listener, without waiting: with
// nothing queued it fails (wrapping sys.ErrNothingQueued) and keeps the
// listener. The connecting process must run as this process's user or
// root.
func (fs *Files) Accept() error {
	if fs.ln == nil {
		return errors.New("direct bell: no listener")
	}
	if fs.Bell[1] != nil {
		return errors.New("direct bell: side 1's bell is set already")
	}
	b, err := sys.AcceptSocketBell(fs.ln)
	if err != nil {
		return fmt.Errorf("direct bell: %w", err)
	}
	fs.Bell[1] = b
	err = fs.ln.Close()
	fs.ln = nil
	return err
}

// NewBells makes the two bells of a connection whose sides are not two
// exnds of one host (across hosts: the program's and the engine's; tests):
// the ends of a socketpair, b0 for side 0 and b1 for side 1.
func NewBells() (b0, b1 *os.File, err error) {
	b0, b1, err = sys.SocketBellPair("direct-bell")
	if err != nil {
		return nil, nil, fmt.Errorf("direct bell: %w", err)
	}
	return b0, b1, nil
}

// CreatePair makes a connection's buffer NAME in dir (rings of ring
// bytes) and both bells from a socketpair, and returns each side's
// Files: fs0 with its own descriptor of the buffer and Bell[0], fs1 with
// another and Bell[1]. The name stays until Remove (no listener is
// made). For tests, and for pairing the two sides of one buffer in one
// process.
func CreatePair(dir, name string, ring int) (fs0, fs1 *Files, err error) {
	fs1, err = CreateBuffer(dir, name, ring)
	if err != nil {
		return nil, nil, err
	}
	fs0 = &Files{}
	defer func() {
		if err != nil {
			fs0.Close()
			fs1.Close()
			os.Remove(filepath.Join(dir, name))
		}
	}()
	fs0.Buf, err = os.OpenFile(filepath.Join(dir, name), os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open direct buffer: %w", err)
	}
	if fs0.Bell[0], fs1.Bell[1], err = NewBells(); err != nil {
		return nil, nil, err
	}
	return fs0, fs1, nil
}

// Remove unlinks a connection's names in dir (those that exist): the
// buffer and its listener's.
func Remove(dir, name string) error {
	path := filepath.Join(dir, name)
	var errs []error
	for _, p := range []string{path, path + bellSuffix} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close closes the files still set (a listener with a connection queued
// resets it: the connected side's bell reads end of file).
func (fs *Files) Close() error {
	var errs []error
	for _, f := range []**os.File{&fs.Buf, &fs.Bell[0], &fs.Bell[1], &fs.ln} {
		if *f != nil {
			errs = append(errs, (*f).Close())
			*f = nil
		}
	}
	return errors.Join(errs...)
}
