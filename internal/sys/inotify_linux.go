package sys

// Close events of a directory (inotify), for fabric/shm's liveness: a
// node's files close when its process dies, so a watcher learns of a
// death without probing every peer on a timer.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// CloseEventSize is the room one event of a WatchCloses file may take:
// a Read needs a buffer of at least this many bytes.
const CloseEventSize = unix.SizeofInotifyEvent + unix.NAME_MAX + 1

// WatchCloses returns an inotify instance, non-blocking and close-on-exec
// as an *os.File in the netpoller, that reports every file in dir closed
// (IN_CLOSE_WRITE, IN_CLOSE_NOWRITE), created or linked in (IN_CREATE,
// IN_MOVED_TO) or removed (IN_DELETE). Read it
// into a buffer of at least CloseEventSize bytes and pass what was read to CloseEventNames. The caller owns the file;
// closing it ends a blocked Read.
func WatchCloses(dir string) (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE|unix.IN_CLOSE_NOWRITE|unix.IN_CREATE|unix.IN_MOVED_TO|unix.IN_DELETE|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify_add_watch %s: %w", dir, err)
	}
	return os.NewFile(uintptr(fd), "inotify:"+dir), nil
}

// CloseEventNames calls f with the name of each event in b (what one Read
// of a WatchCloses file returned) about a file in the directory, and with
// lost set for a queue overflow (IN_Q_OVERFLOW: events were lost, so the
// caller must assume any file may have changed). Events about the
// directory itself (no name: it was read, or it went away) are skipped.
// It stops at a truncated event.
func CloseEventNames(b []byte, f func(name []byte, lost bool)) {
	for len(b) >= unix.SizeofInotifyEvent {
		mask := binary.NativeEndian.Uint32(b[4:8])
		n := int(binary.NativeEndian.Uint32(b[12:16]))
		end := unix.SizeofInotifyEvent + n
		if n < 0 || end > len(b) {
			return
		}
		name := b[unix.SizeofInotifyEvent:end]
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		switch {
		case mask&unix.IN_Q_OVERFLOW != 0:
			f(nil, true)
		case len(name) > 0:
			f(name, false)
		}
		b = b[end:]
	}
}
