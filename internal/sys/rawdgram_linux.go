package sys

// Datagram I/O without the Go scheduler's system-call bookkeeping, for
// the membership socket (fabric/members/transport.go). A system call
// made through package syscall enters and leaves the scheduler
// (entersyscall), and while the process is idle the runtime's monitor
// thread (sysmon) sleeps until woken by exactly that: every datagram an
// idle exnd reads or sends woke a second thread, on this VM an
// interrupt into a halted vCPU (docs/membership.md, "Raw datagram
// calls"). recvfrom and sendto on a non-blocking socket never block, so
// they may go as raw system calls, as the runtime's own epoll_wait and
// futex calls do: the caller waits for readiness through the netpoller
// (syscall.RawConn), which costs no system call either.

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RecvfromRaw reads one datagram from the non-blocking socket fd into b
// and returns its length and source. EAGAIN means none is queued; a
// datagram longer than b is truncated to len(b), as recvfrom does.
func RecvfromRaw(fd int, b []byte) (int, netip.AddrPort, error) {
	var sa unix.RawSockaddrAny
	salen := uint32(unsafe.Sizeof(sa))
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(p), uintptr(len(b)), 0,
		uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&salen)))
	if e != 0 {
		return 0, netip.AddrPort{}, e
	}
	return int(n), rawAddrPort(&sa), nil
}

// SendtoRaw sends b as one datagram from the non-blocking socket fd to
// to; v6 says fd is an AF_INET6 socket (SockIs6), where an IPv4
// destination goes as a v4-mapped address. EAGAIN means the send buffer
// is full.
func SendtoRaw(fd int, v6 bool, b []byte, to netip.AddrPort) error {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	var sa4 unix.RawSockaddrInet4
	var sa6 unix.RawSockaddrInet6
	var sa unsafe.Pointer
	var salen uintptr
	port := to.Port()
	if ip := to.Addr(); ip.Is4() && !v6 {
		sa4.Family = unix.AF_INET
		sa4.Port = port<<8 | port>>8
		sa4.Addr = ip.As4()
		sa, salen = unsafe.Pointer(&sa4), unsafe.Sizeof(sa4)
	} else {
		sa6.Family = unix.AF_INET6
		sa6.Port = port<<8 | port>>8
		sa6.Addr = ip.As16()
		sa, salen = unsafe.Pointer(&sa6), unsafe.Sizeof(sa6)
	}
	_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(p), uintptr(len(b)), 0, uintptr(sa), salen)
	if e != 0 {
		return e
	}
	return nil
}

// SockIs6 says whether fd is an AF_INET6 socket (SO_DOMAIN); ask once
// per socket, not per datagram.
func SockIs6(fd int) bool {
	d, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	return err == nil && d == unix.AF_INET6
}

// rawAddrPort decodes an inet source address; the zero AddrPort for
// another family.
func rawAddrPort(sa *unix.RawSockaddrAny) netip.AddrPort {
	switch sa.Addr.Family {
	case unix.AF_INET:
		a := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), a.Port<<8|a.Port>>8)
	case unix.AF_INET6:
		a := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), a.Port<<8|a.Port>>8)
	}
	return netip.AddrPort{}
}
