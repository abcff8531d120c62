package sys

// Socket helpers for exnd's shim server (extds/shimsrv): a stream
// socketpair for the application's end of a spliced connection, a
// non-blocking MSG_PEEK, a hang-up check, O_NONBLOCK save/restore on a
// descriptor shared with an application, process liveness, and the age
// of an accepted connection; TCP_USER_TIMEOUT for fabnet sessions.

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Socketpair returns a connected AF_UNIX SOCK_STREAM pair, both ends
// close-on-exec and blocking, as files the caller owns.
func Socketpair(name string) (a, b *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", os.NewSyscallError("socketpair", err))
	}
	return os.NewFile(uintptr(fds[0]), name+"-a"), os.NewFile(uintptr(fds[1]), name+"-b"), nil
}

// RecvPeek copies the bytes queued on socket fd into b without consuming
// them (MSG_PEEK|MSG_DONTWAIT). It returns n == 0, nil at end of stream,
// and unix.EAGAIN when nothing is queued yet.
func RecvPeek(fd int, b []byte) (int, error) {
	for {
		n, _, err := unix.Recvfrom(fd, b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch err {
		case nil:
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, unix.EAGAIN
		}
		return 0, os.NewSyscallError("recv", err)
	}
}

// IsEAGAIN reports whether err is EAGAIN (RecvPeek found nothing queued).
func IsEAGAIN(err error) bool { return err == unix.EAGAIN }

// HungUp reports whether fd's peer has gone entirely: poll reports POLLHUP
// (for a stream socketpair: the other end was closed, or both directions
// shut down), not merely the end of its writes. It never blocks.
func HungUp(fd int) (bool, error) {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, os.NewSyscallError("poll", err)
		}
		return p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0, nil
	}
}

// Nonblocking reports whether fd's open file description has O_NONBLOCK.
// Descriptors passed over a unix socket share their description with the
// sender, so a server that wraps one (net.FileConn sets O_NONBLOCK) must
// restore the flag before the sender uses its copy again.
func Nonblocking(fd int) (bool, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return false, os.NewSyscallError("fcntl", err)
	}
	return fl&unix.O_NONBLOCK != 0, nil
}

// SetNonblocking sets or clears O_NONBLOCK on fd's open file description.
func SetNonblocking(fd int, on bool) error {
	return os.NewSyscallError("fcntl", unix.SetNonblock(fd, on))
}

// IsTCPSocket reports whether fd is a connected-type TCP socket
// (SOCK_STREAM in AF_INET or AF_INET6).
func IsTCPSocket(fd int) (bool, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return false, os.NewSyscallError("getsockopt", err)
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return false, os.NewSyscallError("getsockopt", err)
	}
	return typ == unix.SOCK_STREAM && (dom == unix.AF_INET || dom == unix.AF_INET6), nil
}

// ProcessAlive reports whether process pid exists, by kill(pid, 0): EPERM
// (someone else's process) counts as alive, ESRCH as gone. pid must be
// positive (0 and negative values address process groups).
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || err == unix.EPERM
}

// TCPSinceLastAck returns how long ago TCP socket fd last received an
// ACK (tcp_info's tcpi_last_ack_recv, in milliseconds from jiffies, so
// ± one jiffy). For an accepted socket whose peer has sent nothing yet
// that is the handshake's last ACK: the age of the connection.
func TCPSinceLastAck(fd int) (time.Duration, error) {
	ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, fmt.Errorf("getsockopt TCP_INFO: %w", err)
	}
	return time.Duration(ti.Last_ack_recv) * time.Millisecond, nil
}

// SetTCPUserTimeout sets TCP_USER_TIMEOUT on TCP socket fd: the kernel
// aborts the connection when data it sent stays unacknowledged for d
// (fabric/fabnet's sessions, whose idle liveness is membership's).
func SetTCPUserTimeout(fd int, d time.Duration) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond)); err != nil {
		return fmt.Errorf("setsockopt TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}
