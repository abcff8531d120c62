package sys

// Socket bells for EXT-DS direct connections (extds/dring,
// docs/direct.md "One bell per side"): each side of a connection holds
// one end of a connected AF_UNIX SOCK_STREAM pair. Writing a byte into
// one's own end rings the other side (its end becomes readable), and a
// side parks by polling its own end. The pair is made by a socketpair
// (SocketBellPair) or, between two exnds of one host, by a listener
// bound in the buffers' directory (ListenSocketBell, ConnectSocketBell,
// AcceptSocketBell).
//
// Every file made here is non-blocking and close-on-exec but NOT in Go's
// netpoller: it is created blocking, wrapped by os.NewFile (which then
// leaves it out of the netpoller), and only then made non-blocking with
// a raw fcntl, as extds/dring's FIFO bells were. A bell registered in a
// netpoller wakes that process's poller thread at every ring, whether or
// not a goroutine waits on it; a holder that must park registers a dup
// of its own (PollableFile). As in fifo.go, ringing and draining are raw
// system calls on non-blocking descriptors: they never block and never
// allocate.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	// ErrBellGone: the other end of a socket bell is closed in every
	// process that held it (EPIPE, ECONNRESET on a ring).
	ErrBellGone = errors.New("bell: the other end is gone")
	// ErrNothingQueued: AcceptSocketBell found no connection waiting.
	ErrNothingQueued = errors.New("bell: no connection queued")
	// ErrForeignPeer: the process at the other end of a bell connection
	// runs as another user (neither this process's uid nor root).
	ErrForeignPeer = errors.New("bell: peer runs as another user")
)

// maxSunPath is the room for a path in sockaddr_un (108 with its NUL).
const maxSunPath = len(unix.RawSockaddrUnix{}.Path) - 1

// RingSocketBell writes one byte into the socket bell fd (send with
// MSG_DONTWAIT|MSG_NOSIGNAL: no wait, no SIGPIPE). A full socket
// (EAGAIN) already holds a ring and counts as success; a peer that is
// gone (EPIPE, ECONNRESET) is ErrBellGone, which ringers may ignore.
func RingSocketBell(fd int) error {
	b := byte('x')
	for {
		_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b)), 1,
			unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
		switch e {
		case 0, unix.EAGAIN:
			return nil
		case unix.EINTR:
			continue
		case unix.EPIPE, unix.ECONNRESET:
			return ErrBellGone
		}
		return fmt.Errorf("ring bell: %w", e)
	}
}

// DrainSocketBell reads what the socket bell fd holds into buf (reused),
// non-blocking, until EAGAIN, and returns how many bytes it consumed. eof
// reports that every holder of the other end closed it (a read of 0, or
// ECONNRESET: it closed with our rings unread, or was never accepted):
// the bell stays readable from then on.
func DrainSocketBell(fd int, buf []byte) (n int, eof bool, err error) {
	if len(buf) == 0 {
		return 0, false, errors.New("drain bell: empty buffer")
	}
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)),
			unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			if r == 0 {
				return n, true, nil
			}
			n += int(r)
			continue
		case unix.EAGAIN:
			return n, false, nil
		case unix.EINTR:
			continue
		case unix.ECONNRESET:
			return n, true, nil
		}
		return n, false, fmt.Errorf("drain bell: %w", e)
	}
}

// unpolled wraps a fresh, still blocking descriptor (nobody else shares
// its open file description) as an *os.File out of the netpoller, then
// makes it non-blocking. It closes fd on error.
func unpolled(fd int, name string) (*os.File, error) {
	f := os.NewFile(uintptr(fd), name) // blocking: not registered
	if err := unix.SetNonblock(fd, true); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: nonblock: %w", name, err)
	}
	return f, nil
}

// SocketBellPair returns the two ends of a new bell (a connected AF_UNIX
// SOCK_STREAM pair), non-blocking, close-on-exec, out of the netpoller.
func SocketBellPair(name string) (a, b *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("bell socketpair: %w", err)
	}
	if a, err = unpolled(fds[0], name+"-a"); err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	if b, err = unpolled(fds[1], name+"-b"); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// withSockaddr runs fn with the address of path. A path too long for
// sockaddr_un (a deep test directory) is reached through
// /proc/self/fd/N/, N a descriptor of its directory held during fn.
func withSockaddr(path string, fn func(*unix.SockaddrUnix) error) error {
	if len(path) <= maxSunPath {
		return fn(&unix.SockaddrUnix{Name: path})
	}
	dfd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket path %s: %w", path, err)
	}
	defer unix.Close(dfd)
	short := fmt.Sprintf("/proc/self/fd/%d/%s", dfd, filepath.Base(path))
	if len(short) > maxSunPath {
		return fmt.Errorf("socket path %s: name too long", path)
	}
	return fn(&unix.SockaddrUnix{Name: short})
}

// ListenSocketBell binds a listening AF_UNIX SOCK_STREAM socket at path
// (which must not exist) with mode 0600 and the given backlog, and
// returns it non-blocking, close-on-exec, out of the netpoller.
func ListenSocketBell(path string, backlog int) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("bell listener: %w", err)
	}
	f, err := unpolled(fd, path)
	if err != nil {
		return nil, err
	}
	// bind gives the new name the socket inode's mode less the umask:
	// set it first, so that the name is never reachable by others.
	if err := unix.Fchmod(fd, 0o600); err != nil {
		f.Close()
		return nil, fmt.Errorf("bell listener %s: fchmod: %w", path, err)
	}
	if err := withSockaddr(path, func(sa *unix.SockaddrUnix) error { return unix.Bind(fd, sa) }); err != nil {
		f.Close()
		return nil, fmt.Errorf("bell listener %s: bind: %w", path, err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("bell listener %s: listen: %w", path, err)
	}
	return f, nil
}

// ConnectSocketBell connects a new socket to the listener at path and
// returns it non-blocking, close-on-exec, out of the netpoller. It never
// waits for the accept: an AF_UNIX connect to a listener with room in
// its backlog completes at once, and a full one fails (EAGAIN). The
// listener must belong to this process's user or root (ErrForeignPeer).
func ConnectSocketBell(path string) (*os.File, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("bell connect: %w", err)
	}
	f, err := unpolled(fd, path)
	if err != nil {
		return nil, err
	}
	err = withSockaddr(path, func(sa *unix.SockaddrUnix) error {
		for {
			err := unix.Connect(fd, sa)
			if err != unix.EINTR {
				return err
			}
		}
	})
	if err == nil {
		err = checkPeerUID(fd)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("bell connect %s: %w", path, err)
	}
	return f, nil
}

// AcceptSocketBell accepts the connection queued on ln (a
// ListenSocketBell listener) without waiting: ErrNothingQueued if there
// is none. The accepted socket's peer must run as this process's user
// or root (ErrForeignPeer). It is returned non-blocking, close-on-exec,
// out of the netpoller.
func AcceptSocketBell(ln *os.File) (*os.File, error) {
	rc, err := ln.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("bell accept: %w", err)
	}
	nfd, aerr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		for {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC)
			if aerr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return nil, fmt.Errorf("bell accept: %w", err)
	}
	switch {
	case aerr == unix.EAGAIN:
		return nil, ErrNothingQueued
	case aerr != nil:
		return nil, fmt.Errorf("bell accept: %w", aerr)
	}
	f, err := unpolled(nfd, ln.Name()+"-accepted")
	if err != nil {
		return nil, err
	}
	if err := checkPeerUID(nfd); err != nil {
		f.Close()
		return nil, fmt.Errorf("bell accept: %w", err)
	}
	return f, nil
}

// checkPeerUID checks that the process at the other end of connected
// AF_UNIX socket fd ran as this process's user or root (SO_PEERCRED:
// its credentials at connect or listen).
func checkPeerUID(fd int) error {
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return fmt.Errorf("SO_PEERCRED: %w", err)
	}
	if cred.Uid != 0 && cred.Uid != uint32(os.Getuid()) {
		return fmt.Errorf("uid %d: %w", cred.Uid, ErrForeignPeer)
	}
	return nil
}
