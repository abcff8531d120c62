package sys

// The bound address of a socket, as the kernel says (getsockname): exnd's
// shim server records where a registered listener listens, so that a
// connection accepted from another socket on the same port number (another
// address or family, another user) is not mistaken for one of its own.
// And what a TCP connection carried (TCP_INFO), for the tests that check
// that an agreement wrote nothing into a stream.

import (
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// SockName returns the local address of the inet socket fd.
func SockName(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, os.NewSyscallError("getsockname", err)
	}
	return inetAddrPort(sa)
}

// SockPeerName returns the local and the remote address of the connected
// inet socket fd.
func SockPeerName(fd int) (local, remote netip.AddrPort, err error) {
	if local, err = SockName(fd); err != nil {
		return
	}
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return local, remote, os.NewSyscallError("getpeername", err)
	}
	remote, err = inetAddrPort(sa)
	return
}

func inetAddrPort(sa unix.Sockaddr) (netip.AddrPort, error) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("socket has no inet address")
}

// TCPBytes returns the payload bytes a TCP socket has had acknowledged
// by its peer and received (TCP_INFO's tcpi_bytes_acked and
// tcpi_bytes_received): what crossed the connection, whoever read it.
// The kernel counts the SYN's sequence number in tcpi_bytes_acked; it is
// taken off.
func TCPBytes(c syscall.Conn) (acked, received uint64, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return 0, 0, err
	}
	if ierr != nil {
		return 0, 0, fmt.Errorf("TCP_INFO: %w", ierr)
	}
	if info.Bytes_acked > 0 {
		info.Bytes_acked-- // the SYN
	}
	return info.Bytes_acked, info.Bytes_received, nil
}
