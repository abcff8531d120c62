package sys

// The bound address of a socket, as the kernel says (getsockname): exnd's
// shim server records where a registered listener listens, so that a
// connection accepted from another socket on the same port number (another
// address or family, another user) is not mistaken for one of its own.

import (
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// SockName returns the local address of the inet socket fd.
func SockName(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, os.NewSyscallError("getsockname", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("socket has no inet address")
}
