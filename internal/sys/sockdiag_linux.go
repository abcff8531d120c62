package sys

// One TCP connection as the kernel's sock_diag (NETLINK_SOCK_DIAG,
// inet_diag) knows it, looked up by its exact 4-tuple: whether a process
// has accepted it yet, and how long ago its peer last acknowledged
// anything. exnd asks when a peer's CLAIM arrives for a connection that
// no acceptor asked about (extds/internal/agree/hold.go): a connection already accepted
// and made inside a hold was taken as plain TCP without asking.
//
// The request is the exact lookup (no NLM_F_DUMP): the kernel answers
// with one inet_diag_msg and its tcp_info, or with ENOENT. It is a few
// microseconds of kernel work and never waits; the netlink socket lives
// for one call.

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TCPConnInfo is what LookupTCP learned about one connection.
type TCPConnInfo struct {
	// Accepted: the connection has a socket (a process accepted it, or
	// it was connected from this side); false while it waits in a
	// listener's accept queue (inet_diag_msg.idiag_inode is 0 then).
	Accepted bool
	// SinceLastAck is tcp_info's tcpi_last_ack_recv: for an accepted
	// connection whose peer has sent nothing, the time since the
	// handshake's last ACK (milliseconds, counted in jiffies).
	SinceLastAck time.Duration
}

// Sizes and offsets of the inet_diag ABI (linux/inet_diag.h).
const (
	diagReqLen     = 56 // struct inet_diag_req_v2
	diagMsgLen     = 72 // struct inet_diag_msg
	diagStateOff   = 1  // inet_diag_msg.idiag_state
	diagIDOff      = 4  // inet_diag_msg.id: sport, dport (network order), ...
	diagInodeOff   = 68 // inet_diag_msg.idiag_inode
	tcpListen      = 10 // TCP_LISTEN
	diagAttrInfo   = 2  // INET_DIAG_INFO: struct tcp_info
	diagNoCookie   = 0xFFFFFFFF
	diagRecvBuffer = 4096 // one answer: the message, tcp_info and a few small attributes
)

// lastAckOff is tcp_info's tcpi_last_ack_recv.
var lastAckOff = int(unsafe.Offsetof(unix.TCPInfo{}.Last_ack_recv))

// LookupTCP asks the kernel about the TCP connection between local and
// remote, as seen from local, in the calling thread's network namespace.
// ok is false when there is no such connection (ENOENT); err is any other
// failure. Both addresses must be of one family (IPv4-mapped IPv6
// addresses count as IPv4). Safe for concurrent use.
func LookupTCP(local, remote netip.AddrPort) (info TCPConnInfo, ok bool, err error) {
	la, ra := local.Addr().Unmap(), remote.Addr().Unmap()
	if la.Is4() != ra.Is4() || !la.IsValid() || !ra.IsValid() {
		return TCPConnInfo{}, false, fmt.Errorf("sock_diag: %v and %v are not one family", local, remote)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return TCPConnInfo{}, false, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	req := encodeDiagReq(la, ra, local.Port(), remote.Port())
	if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return TCPConnInfo{}, false, os.NewSyscallError("sendto", err)
	}
	var buf [diagRecvBuffer]byte
	for {
		n, _, err := unix.Recvfrom(fd, buf[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return TCPConnInfo{}, false, os.NewSyscallError("recvfrom", err)
		}
		return parseDiagAnswer(buf[:n], local.Port(), remote.Port())
	}
}

// encodeDiagReq is one SOCK_DIAG_BY_FAMILY request (nlmsghdr and
// inet_diag_req_v2) for the exact 4-tuple, asking for tcp_info.
func encodeDiagReq(la, ra netip.Addr, lport, rport uint16) [unix.NLMSG_HDRLEN + diagReqLen]byte {
	var b [unix.NLMSG_HDRLEN + diagReqLen]byte
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(b[8:], 1) // sequence
	r := b[unix.NLMSG_HDRLEN:]
	r[0] = unix.AF_INET6
	if la.Is4() {
		r[0] = unix.AF_INET
	}
	r[1] = unix.IPPROTO_TCP
	r[2] = 1 << (diagAttrInfo - 1)  // idiag_ext
	ne.PutUint32(r[4:], 0xFFFFFFFF) // idiag_states: all
	// inet_diag_sockid: ports and addresses in network order.
	id := r[8:]
	binary.BigEndian.PutUint16(id[0:], lport)
	binary.BigEndian.PutUint16(id[2:], rport)
	l, rr := la.As16(), ra.As16()
	if la.Is4() {
		l4, r4 := la.As4(), ra.As4()
		copy(id[4:8], l4[:])
		copy(id[20:24], r4[:])
	} else {
		copy(id[4:20], l[:])
		copy(id[20:36], rr[:])
	}
	ne.PutUint32(id[36:], 0) // idiag_if: any
	ne.PutUint32(id[40:], diagNoCookie)
	ne.PutUint32(id[44:], diagNoCookie)
	return b
}

// parseDiagAnswer decodes the kernel's answer to encodeDiagReq for the
// ports lport and rport. The kernel's exact lookup falls back to the
// listener on lport when no connection matches: that answer (state
// LISTEN, or other ports) is "not found".
func parseDiagAnswer(b []byte, lport, rport uint16) (TCPConnInfo, bool, error) {
	ne := binary.NativeEndian
	typ, body, _, err := nlNext(b)
	switch {
	case err != nil:
		return TCPConnInfo{}, false, err
	case typ == unix.NLMSG_ERROR:
		errno, err := nlErrno(body)
		if errno == unix.ENOENT {
			return TCPConnInfo{}, false, nil
		}
		return TCPConnInfo{}, false, err
	case typ != unix.SOCK_DIAG_BY_FAMILY:
		return TCPConnInfo{}, false, fmt.Errorf("sock_diag: unexpected message type %d", typ)
	}
	if len(body) < diagMsgLen {
		return TCPConnInfo{}, false, fmt.Errorf("sock_diag: short inet_diag_msg (%d bytes)", len(body))
	}
	if body[diagStateOff] == tcpListen || binary.BigEndian.Uint16(body[diagIDOff:]) != lport || binary.BigEndian.Uint16(body[diagIDOff+2:]) != rport {
		return TCPConnInfo{}, false, nil
	}
	info := TCPConnInfo{Accepted: ne.Uint32(body[diagInodeOff:]) != 0}
	for a := body[diagMsgLen:]; len(a) >= unix.SizeofRtAttr; {
		alen, atyp := int(ne.Uint16(a)), ne.Uint16(a[2:])
		if alen < unix.SizeofRtAttr || alen > len(a) {
			return TCPConnInfo{}, false, fmt.Errorf("sock_diag: bad attribute length %d", alen)
		}
		if atyp == diagAttrInfo {
			ti := a[unix.SizeofRtAttr:alen]
			if len(ti) < lastAckOff+4 {
				return TCPConnInfo{}, false, fmt.Errorf("sock_diag: short tcp_info (%d bytes)", len(ti))
			}
			info.SinceLastAck = time.Duration(ne.Uint32(ti[lastAckOff:])) * time.Millisecond
			return info, true, nil
		}
		a = a[min((alen+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(a)):]
	}
	return TCPConnInfo{}, false, fmt.Errorf("sock_diag: no tcp_info in the answer")
}

// nlNext splits the first netlink message off b: its type, its body and
// the messages after it (aligned). An error names a short or overlong
// message.
func nlNext(b []byte) (typ uint16, body, rest []byte, err error) {
	ne := binary.NativeEndian
	if len(b) < unix.NLMSG_HDRLEN {
		return 0, nil, nil, fmt.Errorf("sock_diag: short message (%d bytes)", len(b))
	}
	mlen := int(ne.Uint32(b))
	if mlen < unix.NLMSG_HDRLEN || mlen > len(b) {
		return 0, nil, nil, fmt.Errorf("sock_diag: bad message length %d of %d", mlen, len(b))
	}
	next := min((mlen+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b))
	return ne.Uint16(b[4:]), b[unix.NLMSG_HDRLEN:mlen], b[next:], nil
}

// nlErrno is the errno of an NLMSG_ERROR body, and it as an error.
func nlErrno(body []byte) (unix.Errno, error) {
	if len(body) < 4 {
		return 0, fmt.Errorf("sock_diag: short error message")
	}
	errno := unix.Errno(-int32(binary.NativeEndian.Uint32(body)))
	return errno, os.NewSyscallError("sock_diag", errno)
}
