package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// MaxWritev is the most buffers one Writev call takes; more is an
// EINVAL. It is far above what a caller batches (fabric/fabnet: a control
// buffer plus a header and a data slice for each of its writeChunks).
const MaxWritev = 64

// Writev is a raw writev(2) with its own iovec array, for a writer that
// sends batches of slices to a non-blocking stream socket (fabric/fabnet's
// session writer). Raw: the call does not go through the runtime's
// entersyscall, so a long copy into the socket buffer (hundreds of KiB
// per batch) does not make sysmon retake the writer's P and hand it to
// another thread; on a host with few cores that hand-off and sysmon's
// 20 µs polling that follows were about 5 % of a busy exnd. The zero
// value is ready. One goroutine at a time; it does not allocate.
type Writev struct {
	iov [MaxWritev]unix.Iovec
}

// Write writes bufs to the non-blocking fd with one writev. It returns
// the bytes written, which may be fewer than the total (the caller
// advances its slices and calls again), EAGAIN when the socket buffer
// is full and nothing was written, and the errno otherwise. Empty
// slices are skipped.
func (w *Writev) Write(fd int, bufs [][]byte) (int, error) {
	k := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if k == MaxWritev {
			return 0, unix.EINVAL
		}
		w.iov[k] = iovec(b)
		k++
	}
	if k == 0 {
		return 0, nil
	}
	for {
		r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&w.iov[0])), uintptr(k))
		if e == unix.EINTR {
			continue
		}
		clear(w.iov[:k]) // drop the references to the caller's memory
		if e != 0 {
			return 0, errnoErr(e)
		}
		return int(r), nil
	}
}

// Read is a raw read(2) from the non-blocking fd into b, for the same
// reason as Writev (fabric/fabnet's session reader): 0, nil is end of
// stream, EAGAIN nothing queued.
func Read(fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	for {
		r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(p), uintptr(len(b)))
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, errnoErr(e)
		}
		return int(r), nil
	}
}
