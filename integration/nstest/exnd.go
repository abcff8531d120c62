package nstest

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Node is an exnd running in a namespace of its own.
type Node struct {
	NS     *Netns
	ID     int
	IP     netip.Addr // IPv4 address on exn0
	IP6    netip.Addr // global IPv6 address on exn0
	Fabric string
	// Control is the node's own control socket (namespaces share the
	// file system, so every node needs its own path).
	Control string
	Proc    *Proc
	args    []string
}

// NodeIP is the IPv4 address the harness gives node id on subnet (the
// third octet of 10.77.subnet.0/24).
func NodeIP(subnet, id int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 77, byte(subnet), byte(id)})
}

// NodeIP6 is the IPv6 address the harness gives node id: fd77:<subnet>::<id>/64.
func NodeIP6(subnet, id int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd77:%x::%x", subnet, id))
}

// StartNode creates a namespace and starts exnd in it as node id on shm
// fabric fab, with 10.77.subnet.id/24 and fd77:subnet::id/64 on exn0, and
// waits until exn0 is up. Each node gets its own control socket in a
// temporary directory (Node.Control). extra flags are appended, so a
// --control in extra overrides it (and Node.Control says so).
func StartNode(t testing.TB, exnd, fab string, subnet, id int, extra ...string) *Node {
	t.Helper()
	n := &Node{NS: NewNetns(t, "n"+strconv.Itoa(id)+"-"), ID: id, Fabric: fab,
		IP: NodeIP(subnet, id), IP6: NodeIP6(subnet, id),
		Control: filepath.Join(t.TempDir(), "exnd.sock")}
	n.args = append([]string{exnd, "--node-id", strconv.Itoa(id), "--fabric", "shm:" + fab,
		"--addr", n.IP.String() + "/24," + n.IP6.String() + "/64", "--control", n.Control}, extra...)
	n.Control = controlFlag(n.args)
	n.Start(t)
	return n
}

// controlFlag is the value of the last --control in args (exnd's flags
// parse the last one).
func controlFlag(args []string) string {
	v := ""
	for i, a := range args {
		if a == "--control" && i+1 < len(args) {
			v = args[i+1]
		}
	}
	return v
}

// Start (re)starts exnd in the node's namespace and waits for exn0.
func (n *Node) Start(t testing.TB) {
	t.Helper()
	n.Proc = n.NS.Start(t, n.args...)
	if err := n.WaitUp(10 * time.Second); err != nil {
		t.Fatalf("node %d: %v\nexnd output:\n%s", n.ID, err, n.Proc.Output())
	}
}

// WaitUp polls `ip -n NS link show exn0` until the interface is up, and
// fails early if exnd exits.
func (n *Node) WaitUp(timeout time.Duration) error {
	return Eventually(timeout, func() error {
		if n.Proc.Exited() {
			return fmt.Errorf("exnd exited: %v", n.Proc.Wait(0))
		}
		out, err := runIP("-n", n.NS.Name, "link", "show", "exn0")
		if err != nil {
			return fmt.Errorf("exn0 not there yet: %v: %s", err, out)
		}
		if !strings.Contains(out, ",UP") && !strings.Contains(out, "<UP") {
			return fmt.Errorf("exn0 not up: %s", out)
		}
		return nil
	})
}

// WaitIPv6 waits until exn0 has a link-local address that is no longer
// tentative (duplicate address detection done), and returns it.
func (n *Node) WaitIPv6(timeout time.Duration) (netip.Addr, error) {
	var ll netip.Addr
	err := Eventually(timeout, func() error {
		out, err := runIP("-n", n.NS.Name, "-6", "addr", "show", "dev", "exn0")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if strings.Contains(out, "tentative") {
			return fmt.Errorf("addresses still tentative: %s", out)
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "inet6" && strings.HasPrefix(f[1], "fe80:") {
				p, err := netip.ParsePrefix(f[1])
				if err != nil {
					return err
				}
				ll = p.Addr()
				return nil
			}
		}
		return fmt.Errorf("no link-local address: %s", out)
	})
	return ll, err
}

// Stop sends SIGTERM and waits for exnd to exit.
func (n *Node) Stop(timeout time.Duration) error {
	if err := n.Proc.Stop(timeout); err != nil {
		return fmt.Errorf("node %d: %w", n.ID, err)
	}
	return nil
}

func runIP(args ...string) (string, error) {
	out, err := execOutput(5*time.Second, "ip", args...)
	return out, err
}
