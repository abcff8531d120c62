package sys

// Who is on the other end of a unix socket, as the kernel says
// (SO_PEERCRED, SO_PEERPIDFD), never as a message says; a process's
// supplementary groups; the identity of a listening TCP socket. exnd's
// control server (control/) and shim server (extds/shimsrv) use them to
// authorise callers and to check what a caller hands over.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Cred is a peer's credentials as the kernel recorded them when it
// connected (SO_PEERCRED): process ID, effective user and group ID.
type Cred struct {
	PID int
	UID uint32
	GID uint32
}

// PeerCred returns the credentials of the process at the other end of the
// connected unix socket fd.
func PeerCred(fd int) (Cred, error) {
	u, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return Cred{}, os.NewSyscallError("getsockopt SO_PEERCRED", err)
	}
	return Cred{PID: int(u.Pid), UID: u.Uid, GID: u.Gid}, nil
}

// soPeerPidfd is SO_PEERPIDFD (Linux 6.5).
const soPeerPidfd = 77

// PeerPidfd returns a pidfd for the process at the other end of unix
// socket fd: SO_PEERPIDFD where the kernel has it (the process the
// socket was connected by, immune to PID reuse), else pidfd_open of the
// SO_PEERCRED pid checked still alive. The caller closes it.
func PeerPidfd(fd int, cred Cred) (int, error) {
	pfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, soPeerPidfd)
	if err == nil && pfd >= 0 {
		return pfd, nil
	}
	pfd, err = unix.PidfdOpen(cred.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return -1, os.NewSyscallError("pidfd_open", err)
	}
	return pfd, nil
}

// PidfdAlive reports whether the process behind pidfd still runs (the
// pidfd is readable once it exited).
func PidfdAlive(pidfd int) bool {
	p := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 0
	}
}

// InGroup reports whether process pid has gid as its effective or a
// supplementary group, from /proc/PID/status (the kernel's view; the
// process cannot change it without the privilege to change groups).
func InGroup(pid int, gid uint32) (bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	want := strconv.FormatUint(uint64(gid), 10)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Gid:"):
			f := strings.Fields(line[4:])
			if len(f) > 1 && f[1] == want { // real, effective, saved, fs
				return true, nil
			}
		case strings.HasPrefix(line, "Groups:"):
			for _, g := range strings.Fields(line[7:]) {
				if g == want {
					return true, nil
				}
			}
		}
	}
	return false, nil
}

// ListeningTCPPort returns the local port of fd if it is a listening TCP
// socket (SO_ACCEPTCONN), and an error otherwise.
func ListeningTCPPort(fd int) (uint16, error) {
	ok, err := IsTCPSocket(fd)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("not a TCP socket")
	}
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return 0, os.NewSyscallError("getsockopt SO_ACCEPTCONN", err)
	}
	if acc == 0 {
		return 0, fmt.Errorf("TCP socket is not listening")
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0, os.NewSyscallError("getsockname", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return uint16(a.Port), nil
	case *unix.SockaddrInet6:
		return uint16(a.Port), nil
	}
	return 0, fmt.Errorf("listening socket has no inet address")
}

// SocketInode returns the inode number of socket fd (its identity while
// it exists, as /proc/net/tcp lists it).
func SocketInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, os.NewSyscallError("fstat", err)
	}
	return st.Ino, nil
}

// ListeningTCP returns the inodes of every listening TCP socket of the
// caller's network namespace with their local ports: by sock_diag
// (sockdiag_listen_linux.go, which says why), or from /proc/net/tcp and
// tcp6 (state 0A) where sock_diag cannot answer. A socket is destroyed
// when its last descriptor in any process is closed, so an inode present
// here is a listener still open.
func ListeningTCP() (map[uint64]uint16, error) {
	if out, err := listeningDiag(); err == nil {
		return out, nil
	}
	return listeningProc()
}

// listeningProc is ListeningTCP from /proc/net/tcp and tcp6.
func listeningProc() (map[uint64]uint16, error) {
	out := make(map[uint64]uint16)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue // no IPv6
			}
			return nil, err
		}
		for i, line := range bytes.Split(b, []byte{'\n'}) {
			fs := strings.Fields(string(line))
			if i == 0 || len(fs) < 10 || fs[3] != "0A" {
				continue
			}
			_, port, ok := strings.Cut(fs[1], ":")
			if !ok {
				continue
			}
			p, err1 := strconv.ParseUint(port, 16, 16)
			ino, err2 := strconv.ParseUint(fs[9], 10, 64)
			if err1 == nil && err2 == nil && ino != 0 {
				out[ino] = uint16(p)
			}
		}
	}
	return out, nil
}
