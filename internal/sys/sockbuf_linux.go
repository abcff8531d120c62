package sys

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// SetSockBuf sets the send and receive buffers of the socket behind rc to
// n bytes each. It asks for SO_SNDBUFFORCE/SO_RCVBUFFORCE first, which a
// process with CAP_NET_ADMIN (exnd) may set past net.core.wmem_max and
// rmem_max (212992 on a stock kernel, less than two iperf3 writes); without
// the capability it falls back to SO_SNDBUF/SO_RCVBUF, which the kernel
// silently caps at those limits. Like the plain options, the kernel
// doubles the value for its bookkeeping. Safe for concurrent use.
func SetSockBuf(rc syscall.RawConn, n int) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		for _, o := range [...]struct{ force, plain int }{
			{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF},
			{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF},
		} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o.force, n) == nil {
				continue
			}
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o.plain, n); e != nil {
				serr = os.NewSyscallError("setsockopt", e)
				return
			}
		}
	})
	if err != nil {
		return fmt.Errorf("socket buffers: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("socket buffers: %w", serr)
	}
	return nil
}
