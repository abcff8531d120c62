package node

// Helpers shared by the package's tests: a cluster closed (and checked
// for leaked goroutines) at the end of the test, contexts, echo servers.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// quietLogger discards every record.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// newCluster starts an n-node cluster with IPv4 and IPv6 (fd00:88::i/64)
// and closes it at cleanup, after which no goroutine may remain.
func newCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	testenv.VerifyNoLeaks(t)
	opts = append([]ClusterOption{WithConfig(func(c *Config) {
		c.Logger = quietLogger()
		id := c.NIC.Node()
		c.Addr6 = netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 2: 0x00, 3: 0x88, 14: byte(id >> 8), 15: byte(id)}), 64)
	})}, opts...)
	c, err := NewCluster(n, opts...)
	if err != nil {
		t.Fatalf("NewCluster(%d): %v", n, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("cluster close: %v", err)
		}
	})
	return c
}

// twoNodes starts a 2-node cluster as newCluster does and returns it with
// its nodes.
func twoNodes(t testing.TB, opts ...ClusterOption) (c *Cluster, a, b *Node) {
	t.Helper()
	c = newCluster(t, 2, opts...)
	return c, c.Node(0), c.Node(1)
}

// listen listens on network and address addr of node n, failing t if it
// cannot.
func listen(t testing.TB, n *Node, network, addr string) net.Listener {
	t.Helper()
	l, err := n.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// dial connects node from to addr over network, failing t if it cannot;
// the connection is closed when t ends.
func dial(t testing.TB, ctx context.Context, from *Node, network, addr string) net.Conn {
	t.Helper()
	c, err := from.DialContext(ctx, network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// acceptOne accepts one connection on l, in a goroutine, and sends it; if
// Accept fails it closes the channel instead.
func acceptOne(l net.Listener) <-chan net.Conn {
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			acc <- c
		}
		close(acc)
	}()
	return acc
}

// writeUntilErr writes size-byte buffers to w, in a goroutine, until a
// write fails, and then sends that error.
func writeUntilErr(w io.Writer, size int) <-chan error {
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := w.Write(buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	return errc
}

// testCtx is a context that ends after d or with the test.
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// echoServer accepts on l and echoes every conn until it closes.
func echoServer(t testing.TB, l net.Listener) {
	t.Helper()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
}

// dialEcho starts an echo server on port of node to and connects to it
// from node from; the connection is closed when t ends.
func dialEcho(t testing.TB, ctx context.Context, from, to *Node, port int) net.Conn {
	t.Helper()
	echoServer(t, listen(t, to, "tcp", fmt.Sprintf(":%d", port)))
	return dial(t, ctx, from, "tcp", hostPort(to, port))
}

// hostPort is node n's IPv4 address with port.
func hostPort(n *Node, port int) string {
	return net.JoinHostPort(n.Addr().Addr().String(), fmt.Sprint(port))
}
