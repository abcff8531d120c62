package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/exn/node"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// interopSubnet is this file's 10.77.X.0/24 (other tests use 1, 2, 9 and
// the shim's).
const interopSubnet = 11

// TestInterop is issue #4 §2: a kernel node (exnd with a TAP, in a
// namespace), a userspace node (exnd --netstack, in a namespace of its own
// so its loopback forwards are private) and an in-test exn/node share one
// shm fabric. TCP goes both ways between the kernel and each userspace
// node, checked by SHA-256, and ICMP echo both ways.
func TestInterop(t *testing.T) {
	testenv.RequirePrivileged(t, "ip", "ping", "ss", "iperf3")
	exnd := nstest.Build(t)
	fab := nstest.ShmFabric(t)
	kern := nstest.StartNode(t, exnd, fab, interopSubnet, 1)

	// exnd --netstack, node 2: --forward a loopback port to the kernel
	// node, --expose fabric port 7002 to a loopback server.
	nsIP := nstest.NodeIP(interopSubnet, 2)
	toKernel, kernPort, exposed, localSrv := nstest.Port(), nstest.Port(), nstest.Port(), nstest.Port()
	// And a second userspace node, 4, serving iperf3 to node 2 through
	// node 2's --forward and its own --expose (docs/netstack.md's example).
	ip4 := nstest.NodeIP(interopSubnet, 4)
	iperfFwd, iperfExposed, iperfSrv := nstest.Port(), nstest.Port(), nstest.Port()
	userNS := nstest.NewNetns(t, "user-")
	user := startUserspace(t, userNS, exnd, fab, 2, nsIP,
		"--forward", fmt.Sprintf("127.0.0.1:%d=%s:%d", toKernel, kern.IP, kernPort),
		"--forward", fmt.Sprintf("127.0.0.1:%d=%s:%d", iperfFwd, ip4, iperfExposed),
		"--expose", fmt.Sprintf("%d=127.0.0.1:%d", exposed, localSrv))
	user4NS := nstest.NewNetns(t, "user4-")
	startUserspace(t, user4NS, exnd, fab, 4, ip4, "--expose", fmt.Sprintf("%d=127.0.0.1:%d", iperfExposed, iperfSrv))

	// In-test node 3 on the same fabric.
	nic, err := backend.OpenSpec(backend.Spec{Kind: backend.SHM, Arg: fab}, 3, backend.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.Close() })
	n3, err := node.New(node.Config{NIC: nic, Addr: netip.PrefixFrom(nstest.NodeIP(interopSubnet, 3), 24),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n3.Close() })

	size := 16 << 20
	if testenv.Small() {
		size = 2 << 20
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("ping", func(t *testing.T) {
		for _, ip := range []netip.Addr{nsIP, n3.Addr().Addr()} {
			if _, err := nstest.Ping(kern.NS, ip.String(), 3, 1000, "a5"); err != nil {
				t.Errorf("kernel -> %s: %v", ip, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := n3.Ping(ctx, kern.IP, []byte("interop")); err != nil {
			t.Errorf("node 3 -> kernel: %v", err)
		}
	})

	t.Run("exnd-netstack to kernel", func(t *testing.T) {
		// Receiver on the kernel node; sender in the netstack node's
		// namespace, through --forward.
		recv := kern.NS.StartEnv(t, []string{"EXNT_HELPER=recv", fmt.Sprintf("EXNT_ADDR=%s:%d", kern.IP, kernPort)}, self)
		if err := kern.NS.WaitListening(recv, strconv.Itoa(kernPort), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		out, err := userNS.RunEnv(60*time.Second, []string{"EXNT_HELPER=send", fmt.Sprintf("EXNT_ADDR=127.0.0.1:%d", toKernel),
			fmt.Sprintf("EXNT_SIZE=%d", size), "EXNT_SEED=21"}, self)
		if err != nil {
			t.Fatalf("send: %v\n%s\nexnd:\n%s", err, out, user.Output())
		}
		checkSums(t, out, recv, size)
	})

	t.Run("kernel to exnd-netstack", func(t *testing.T) {
		recv := userNS.StartEnv(t, []string{"EXNT_HELPER=recv", fmt.Sprintf("EXNT_ADDR=127.0.0.1:%d", localSrv)}, self)
		if err := userNS.WaitListening(recv, strconv.Itoa(localSrv), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		out, err := kern.NS.RunEnv(60*time.Second, []string{"EXNT_HELPER=send", fmt.Sprintf("EXNT_ADDR=%s:%d", nsIP, exposed),
			fmt.Sprintf("EXNT_SIZE=%d", size), "EXNT_SEED=22"}, self)
		if err != nil {
			t.Fatalf("send: %v\n%s\nexnd:\n%s", err, out, user.Output())
		}
		checkSums(t, out, recv, size)
	})

	// dialKernRecv starts the recv helper in the kernel node's namespace
	// and connects to it from node 3 within d; c is closed when t ends.
	dialKernRecv := func(t *testing.T, d time.Duration) (recv *nstest.Proc, c net.Conn) {
		t.Helper()
		port := nstest.Port()
		recv = kern.NS.StartEnv(t, []string{"EXNT_HELPER=recv", fmt.Sprintf("EXNT_ADDR=%s:%d", kern.IP, port)}, self)
		if err := kern.NS.WaitListening(recv, strconv.Itoa(port), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		c, err := n3.DialContext(ctx, "tcp", fmt.Sprintf("%s:%d", kern.IP, port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return recv, c
	}

	t.Run("node to kernel", func(t *testing.T) {
		recv, c := dialKernRecv(t, 60*time.Second)
		c.SetDeadline(time.Now().Add(60 * time.Second))
		h := sha256.New()
		if _, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.NewChaCha8(seedBytes(23)), int64(size))); err != nil {
			t.Fatalf("write: %v", err)
		}
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if err := recv.Wait(30 * time.Second); err != nil {
			t.Fatalf("receiver: %v\n%s", err, recv.Output())
		}
		want := fmt.Sprintf("sha256=%s bytes=%d", hex.EncodeToString(h.Sum(nil)), size)
		if got := sumLine(recv.Output()); got != want {
			t.Fatalf("kernel received %q, node 3 sent %q", got, want)
		}
	})

	t.Run("kernel to node", func(t *testing.T) {
		port := nstest.Port()
		ln, err := n3.Listen("tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		got := make(chan string, 1)
		go func() {
			defer close(got)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(60 * time.Second))
			h := sha256.New()
			n, err := io.Copy(h, c)
			if err != nil {
				got <- "read: " + err.Error()
				return
			}
			got <- fmt.Sprintf("sha256=%s bytes=%d", hex.EncodeToString(h.Sum(nil)), n)
		}()
		out, err := kern.NS.RunEnv(60*time.Second, []string{"EXNT_HELPER=send", fmt.Sprintf("EXNT_ADDR=%s:%d", n3.Addr().Addr(), port),
			fmt.Sprintf("EXNT_SIZE=%d", size), "EXNT_SEED=24"}, self)
		if err != nil {
			t.Fatalf("send: %v\n%s", err, out)
		}
		sent := sumLine(out)
		if r := <-got; sent == "" || r != sent || !strings.Contains(sent, fmt.Sprintf("bytes=%d", size)) {
			t.Fatalf("kernel sent %q, node 3 received %q", sent, r)
		}
	})

	t.Run("iperf3 between two exnd --netstack nodes", func(t *testing.T) {
		srv := user4NS.Start(t, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", strconv.Itoa(iperfSrv))
		if err := user4NS.WaitListening(srv, strconv.Itoa(iperfSrv), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		out, err := userNS.Run(40*time.Second, "iperf3", "-c", "127.0.0.1", "-p", strconv.Itoa(iperfFwd), "-t", "2", "-J")
		if err != nil {
			t.Fatalf("iperf3: %v\n%s\nserver:\n%s", err, out, srv.Output())
		}
		var j iperfOut
		if err := json.Unmarshal([]byte(out), &j); err != nil || j.Error != "" || j.End.SumReceived.Bytes < 1<<20 {
			t.Fatalf("iperf3: %v %q, received %.0f bytes\n%s", err, j.Error, j.End.SumReceived.Bytes, out)
		}
		t.Logf("iperf3 node 2 -> node 4 through --forward/--expose: %.2f Gbit/s", j.End.SumReceived.BitsPerSecond/1e9)
	})

	t.Run("kernel crash resets netstack conns", func(t *testing.T) {
		// A connection from node 3 to the kernel node, then the kernel's
		// exnd dies (SIGKILL): node 3 must reset the connection promptly.
		_, c := dialKernRecv(t, 10*time.Second)
		readErr := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1))
			readErr <- err
		}()
		if err := kern.Proc.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		select {
		case err := <-readErr:
			if err == nil || err == io.EOF {
				t.Fatalf("read after the peer died: %v, want a reset", err)
			}
			t.Logf("reset after %v: %v", time.Since(start), err)
		case <-time.After(10 * time.Second):
			t.Fatal("connection to the dead kernel node not reset after 10s")
		}
		if err := nic.Alive(fabric.NodeID(kern.ID)); err == nil {
			t.Errorf("fabric still reports node %d alive", kern.ID)
		}
	})

	if err := user.Stop(10 * time.Second); err != nil {
		t.Fatalf("exnd --netstack: %v after SIGTERM\n%s", err, user.Output())
	}
	if !strings.Contains(user.Output(), "exnd stopped") {
		t.Errorf("exnd --netstack log lacks \"exnd stopped\":\n%s", user.Output())
	}
}

// startUserspace starts exnd --netstack as node id with address ip in
// namespace ns and waits until it is up.
func startUserspace(t *testing.T, ns *nstest.Netns, exnd, fab string, id int, ip netip.Addr, extra ...string) *nstest.Proc {
	t.Helper()
	args := append([]string{exnd, "--node-id", strconv.Itoa(id), "--fabric", "shm:" + fab, "--netstack",
		"--addr", ip.String() + "/24", "--control", ""}, extra...)
	p := ns.Start(t, args...)
	if err := nstest.Eventually(10*time.Second, func() error {
		if p.Exited() {
			return fmt.Errorf("exnd --netstack exited: %v", p.Wait(0))
		}
		if !strings.Contains(p.Output(), "exnd up") {
			return fmt.Errorf("not up yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("node %d: %v\n%s", id, err, p.Output())
	}
	return p
}

// checkSums compares the sender's output with the receiver's.
func checkSums(t *testing.T, sendOut string, recv *nstest.Proc, size int) {
	t.Helper()
	if err := recv.Wait(30 * time.Second); err != nil {
		t.Fatalf("receiver: %v\n%s", err, recv.Output())
	}
	sent, got := sumLine(sendOut), sumLine(recv.Output())
	if sent == "" || sent != got || !strings.Contains(sent, fmt.Sprintf("bytes=%d", size)) {
		t.Fatalf("sent %q, received %q (want %d bytes)", sent, got, size)
	}
}
