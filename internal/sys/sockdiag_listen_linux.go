package sys

// Every listening TCP socket of the caller's network namespace, as the
// kernel's sock_diag lists them (a NLM_F_DUMP of inet_diag with the
// state filter LISTEN only): the shim server's sweep of its listener
// registrations (extds/shimsrv/listen.go) asks once a second.
//
// Why not /proc/net/tcp: to print it the kernel walks every bucket of
// the established-connections hash, which the network namespaces share
// and which is sized by memory (262 144 buckets on a 24 GiB host):
// reading tcp and tcp6 took 13 ms there, 1 % of a core at one sweep a
// second with nothing connected (docs/benchmarks.d/50-shim-xhost.md).
// A dump whose state filter is LISTEN alone never enters that hash
// (inet_diag_dump_icsk returns after the listening hash): its cost is
// the listeners'.

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// tcpfListen is the idiag_states bit of TCP_LISTEN.
const tcpfListen = 1 << tcpListen

// listenDumpBuffer holds one netlink read of a dump (the kernel fills
// what fits, in whole messages, and continues at the next read).
const listenDumpBuffer = 32 << 10

// listeningDiag is ListeningTCP by sock_diag: both families, LISTEN only.
func listeningDiag() (map[uint64]uint16, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	out := make(map[uint64]uint16)
	buf := make([]byte, listenDumpBuffer)
	for seq, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := encodeListenDump(family, uint32(seq+1))
		if err := unix.Sendto(fd, req[:], 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return nil, os.NewSyscallError("sendto", err)
		}
		for done := false; !done; {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return nil, os.NewSyscallError("recvfrom", err)
			}
			if done, err = parseListenDump(buf[:n], out); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// encodeListenDump is one SOCK_DIAG_BY_FAMILY dump request for family's
// TCP sockets in state LISTEN.
func encodeListenDump(family uint8, seq uint32) [unix.NLMSG_HDRLEN + diagReqLen]byte {
	var b [unix.NLMSG_HDRLEN + diagReqLen]byte
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	ne.PutUint32(b[8:], seq)
	r := b[unix.NLMSG_HDRLEN:]
	r[0], r[1] = family, unix.IPPROTO_TCP
	ne.PutUint32(r[4:], tcpfListen) // idiag_states
	ne.PutUint32(r[8+40:], diagNoCookie)
	ne.PutUint32(r[8+44:], diagNoCookie)
	return b
}

// parseListenDump adds the listeners of one read of a dump to out (inode
// → local port) and reports whether the dump is done (NLMSG_DONE). A
// message that is not a listener's is skipped; a malformed one, or an
// error message, is an error.
func parseListenDump(b []byte, out map[uint64]uint16) (done bool, err error) {
	ne := binary.NativeEndian
	for len(b) > 0 {
		typ, body, rest, err := nlNext(b)
		if err != nil {
			return false, err
		}
		switch typ {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			_, err := nlErrno(body)
			return false, err
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(body) < diagMsgLen {
				return false, fmt.Errorf("sock_diag: short inet_diag_msg (%d bytes)", len(body))
			}
			if ino := uint64(ne.Uint32(body[diagInodeOff:])); body[diagStateOff] == tcpListen && ino != 0 {
				out[ino] = binary.BigEndian.Uint16(body[diagIDOff:])
			}
		}
		b = rest
	}
	return false, nil
}
