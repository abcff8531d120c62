// Command gorelay is tap_relay.c's block mode written in Go, for
// perf/ping-bound.sh (BenchmarkPingBound, perf/pingbound_test.go): TAP
// NAME (exn's tap package, which parks in the netpoller) carried to the
// peer one frame per UDP datagram, and back, by two goroutines. Against
// the C relay it prices the Go runtime's wake-ups; against exnd, exnd's
// own design.
//
//	gorelay [-block] NAME LOCAL_IP:PORT PEER_IP:PORT
//
// With -block each direction is a goroutine locked to its thread in
// blocking read(2)s on blocking fds, as tap_relay.c's block mode, and
// GOMAXPROCS is raised by two so that those threads' Ps, which the
// runtime counts as in a system call, leave it the usual number for
// everything else.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/exn-project/exn/internal/sys"
	"github.com/exn-project/exn/tap"
	"golang.org/x/sys/unix"
)

func main() {
	block := flag.Bool("block", false, "blocking reads on locked threads")
	flag.Parse()
	if flag.NArg() != 3 {
		fmt.Fprintln(os.Stderr, "usage: gorelay [-block] NAME LOCAL_IP:PORT PEER_IP:PORT")
		os.Exit(2)
	}
	run := run
	if *block {
		run = runBlock
	}
	if err := run(flag.Arg(0), flag.Arg(1), flag.Arg(2)); err != nil {
		fmt.Fprintln(os.Stderr, "gorelay:", err)
		os.Exit(1)
	}
}

func run(name, local, peer string) error {
	la, err := net.ResolveUDPAddr("udp4", local)
	if err != nil {
		return err
	}
	pa, err := net.ResolveUDPAddr("udp4", peer)
	if err != nil {
		return err
	}
	c, err := net.DialUDP("udp4", la, pa)
	if err != nil {
		return err
	}
	defer c.Close()
	// MTU 1500: the C relay's TAP has the kernel's default too.
	t, err := tap.Open(tap.Config{Name: name, MTU: 1500})
	if err != nil {
		return err
	}
	defer t.Close()
	fmt.Println("ready")
	errc := make(chan error, 2)
	go func() {
		bufs, sizes := [][]byte{make([]byte, tap.FrameSize(1500))}, []int{0}
		for {
			if _, err := t.Read(bufs, sizes); err != nil {
				errc <- err
				return
			}
			if _, err := c.Write(bufs[0][:sizes[0]]); err != nil && !errors.Is(err, unix.ECONNREFUSED) {
				errc <- err
				return
			}
		}
	}()
	go func() {
		buf := make([]byte, 65536)
		frames := [][]byte{nil}
		for {
			n, err := c.Read(buf)
			if errors.Is(err, unix.ECONNREFUSED) {
				continue // the peer's relay is not up yet
			}
			if err != nil {
				errc <- err
				return
			}
			frames[0] = buf[:n]
			t.Write(frames) // a refused frame is dropped, as a NIC would
		}
	}()
	return <-errc
}

func runBlock(name, local, peer string) error {
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + 2)
	tfd, _, err := sys.OpenTAP(name)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	ufd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(ufd)
	la, err := sockaddr(local)
	if err != nil {
		return err
	}
	pa, err := sockaddr(peer)
	if err != nil {
		return err
	}
	if err := unix.Bind(ufd, la); err != nil {
		return err
	}
	if err := unix.Connect(ufd, pa); err != nil {
		return err
	}
	for _, fd := range []int{tfd, ufd} {
		if err := unix.SetNonblock(fd, false); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	errc := make(chan error, 2)
	pump := func(from, to int) {
		runtime.LockOSThread()
		buf := make([]byte, 65536)
		for {
			n, err := unix.Read(from, buf)
			if err == unix.EINTR || err == unix.ECONNREFUSED {
				continue
			}
			if err != nil {
				errc <- err
				return
			}
			unix.Write(to, buf[:n]) // a refused frame is dropped
		}
	}
	go pump(tfd, ufd)
	go pump(ufd, tfd)
	return <-errc
}

func sockaddr(hostport string) (*unix.SockaddrInet4, error) {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return nil, err
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}
