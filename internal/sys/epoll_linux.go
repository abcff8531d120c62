package sys

// An epoll set whose own descriptor sits in Go's netpoller (extds/rdirect's
// engine parks on it). The descriptors in the set (bells) stay out of the
// netpoller, so a ring of one of them wakes this process only while a
// goroutine waits on the set, and the waiting goroutine parks in the
// netpoller (docs/wakeup.md: no goroutine sits in a blocking system call
// to wait). Every call here that cannot block is a raw system call, as in
// fifo.go.

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Epoll is an epoll set watched through Go's netpoller. Add, Del and
// Close may be called from any goroutine; Poll, Wait and Data from one
// goroutine at a time (they share the event array).
type Epoll struct {
	f   *os.File
	rc  syscall.RawConn
	fd  int
	evs []unix.EpollEvent
	n   int
	cb  func(uintptr) bool
	err error
}

// NewEpoll makes an empty set that reports up to max ready descriptors
// per Poll or Wait (max >= 1).
func NewEpoll(max int) (*Epoll, error) {
	if max < 1 {
		return nil, fmt.Errorf("epoll: %d events", max)
	}
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("epoll: nonblock: %w", err)
	}
	f, rc, err := PollableFile(fd, "epoll")
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	p := &Epoll{f: f, rc: rc, fd: fd, evs: make([]unix.EpollEvent, max)}
	p.cb = func(fd uintptr) bool {
		p.n, p.err = p.poll()
		return p.n > 0 || p.err != nil
	}
	return p, nil
}

// Add watches fd for readability (level-triggered); data comes back from
// Data for its events. The caller keeps fd open until Del or Close.
func (p *Epoll) Add(fd int, data uint32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(data)} // Fd: the low half of epoll_data
	if err := unix.EpollCtl(p.fd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("epoll add %d: %w", fd, err)
	}
	return nil
}

// Del stops watching fd.
func (p *Epoll) Del(fd int) error {
	if err := unix.EpollCtl(p.fd, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
		return fmt.Errorf("epoll del %d: %w", fd, err)
	}
	return nil
}

// Poll returns how many descriptors are ready, without blocking; Data
// names them. It does not allocate.
func (p *Epoll) Poll() (int, error) {
	p.n, p.err = p.poll()
	return p.n, p.err
}

func (p *Epoll) poll() (int, error) {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(p.fd), uintptr(unsafe.Pointer(&p.evs[0])), uintptr(len(p.evs)), 0, 0, 0)
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		}
		return 0, fmt.Errorf("epoll_pwait: %w", e)
	}
}

// Wait parks the calling goroutine in the netpoller until at least one
// descriptor is ready and returns how many (Data names them). It returns
// an error when the set is closed or broken. It does not allocate.
func (p *Epoll) Wait() (int, error) {
	p.n, p.err = 0, nil
	if err := p.rc.Read(p.cb); err != nil {
		return 0, fmt.Errorf("epoll wait: %w", err)
	}
	return p.n, p.err
}

// FD is the set's descriptor (to inspect it, e.g. /proc/self/fdinfo in
// tests); it stays the set's.
func (p *Epoll) FD() int { return p.fd }

// Data is the data of the i-th ready descriptor of the last Poll or Wait.
func (p *Epoll) Data(i int) uint32 { return uint32(p.evs[i].Fd) }

// Close closes the set; a Wait in progress returns an error.
func (p *Epoll) Close() error { return p.f.Close() }

// Eventfd is an eventfd used as a bell inside one process: Signal makes
// it readable, Drain empties it. Non-blocking and close-on-exec.
type Eventfd struct{ fd int }

// NewEventfd makes one.
func NewEventfd() (*Eventfd, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &Eventfd{fd: fd}, nil
}

// FD is its descriptor (for Epoll.Add).
func (e *Eventfd) FD() int { return e.fd }

// Signal adds one to the counter. It never blocks and does not allocate.
func (e *Eventfd) Signal() error {
	v := uint64(1)
	for {
		_, _, errno := unix.RawSyscall(unix.SYS_WRITE, uintptr(e.fd), uintptr(unsafe.Pointer(&v)), 8)
		switch errno {
		case 0, unix.EAGAIN: // EAGAIN: the counter is saturated, readable anyway
			return nil
		case unix.EINTR:
			continue
		}
		return fmt.Errorf("eventfd signal: %w", errno)
	}
}

// Drain resets the counter; it reports whether it was signalled.
func (e *Eventfd) Drain() (bool, error) {
	var v uint64
	for {
		_, _, errno := unix.RawSyscall(unix.SYS_READ, uintptr(e.fd), uintptr(unsafe.Pointer(&v)), 8)
		switch errno {
		case 0:
			return true, nil
		case unix.EAGAIN:
			return false, nil
		case unix.EINTR:
			continue
		}
		return false, fmt.Errorf("eventfd drain: %w", errno)
	}
}

// Close closes it.
func (e *Eventfd) Close() error {
	if e.fd < 0 {
		return errors.New("eventfd: closed")
	}
	err := unix.Close(e.fd)
	e.fd = -1
	return err
}

// PollableFile makes fd, a non-blocking descriptor, a file in Go's
// netpoller, so that its RawConn.Read parks the goroutine, not the
// thread. It takes fd over (closed on error). The error wraps
// ErrNotPollable when the runtime could not register it (SetReadDeadline
// fails with ErrNoDeadline on a file the netpoller does not watch).
func PollableFile(fd int, name string) (*os.File, syscall.RawConn, error) {
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err == nil {
		err = f.SetReadDeadline(time.Time{})
	}
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s %w: %v", name, ErrNotPollable, err)
	}
	return f, rc, nil
}
