package nstest

// Nodes on the net fabric: an underlay network the test builds (a bridge
// in a namespace of its own, one veth per node namespace) carries the
// fabric's TCP connections, and exn0 carries the overlay.
//
//	node ns "n1-":  ul0 10.78.S.1/24 ──veth── p1 ┐
//	node ns "n2-":  ul0 10.78.S.2/24 ──veth── p2 ├─ br0 in ns "ul-"
//	node ns "n3-":  ul0 10.78.S.3/24 ──veth── p3 ┘
//	exn0 10.77.S.id/24 and fd77:S::id/64 in every node ns, over the fabric.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
)

// NetPort is the fabric port the harness's net nodes listen on.
const NetPort = 7947

// UnderlayIP is the address the harness gives node id on the underlay
// 10.78.subnet.0/24.
func UnderlayIP(subnet, id int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 78, byte(subnet), byte(id)})
}

// Underlay is a bridge in a namespace of its own that node namespaces
// attach to by veth pairs. Everything is removed with the namespaces on
// cleanup.
type Underlay struct {
	NS     *Netns // holds the bridge br0 and the bridge ends of the veths
	Subnet int
}

// NewUnderlay creates the bridge namespace with br0 up.
func NewUnderlay(t testing.TB, subnet int) *Underlay {
	t.Helper()
	u := &Underlay{NS: NewNetns(t, "ul-"), Subnet: subnet}
	u.NS.MustRun(t, 5*time.Second, "ip", "link", "add", "br0", "type", "bridge")
	u.NS.MustRun(t, 5*time.Second, "ip", "link", "set", "br0", "up")
	return u
}

// Attach links ns to the bridge: a veth pair with "ul0" in ns carrying
// 10.78.subnet.id/24 (up) and "p<id>" on br0. It returns ul0's address.
func (u *Underlay) Attach(t testing.TB, ns *Netns, id int) netip.Addr {
	t.Helper()
	port := "p" + strconv.Itoa(id)
	ip := UnderlayIP(u.Subnet, id)
	u.NS.MustRun(t, 5*time.Second, "ip", "link", "add", port, "type", "veth", "peer", "name", "ul0", "netns", ns.Name)
	u.NS.MustRun(t, 5*time.Second, "ip", "link", "set", port, "master", "br0")
	u.NS.MustRun(t, 5*time.Second, "ip", "link", "set", port, "up")
	ns.MustRun(t, 5*time.Second, "ip", "addr", "add", ip.String()+"/24", "dev", "ul0")
	ns.MustRun(t, 5*time.Second, "ip", "link", "set", "ul0", "up")
	return ip
}

// NetCluster is exnd nodes on the net fabric over one Underlay.
type NetCluster struct {
	Underlay *Underlay
	Nodes    []*Node
	// Peers is the peers file every node reads:
	// "ID 10.78.S.ID:7947 10.77.S.ID" a line.
	Peers string
}

// StartNetCluster builds an underlay on subnet, a namespace per node id
// attached to it, one peers file for all, and starts exnd in each as
// `--fabric net:10.78.S.ID:7947 --peers FILE` with 10.77.S.ID/24 and
// fd77:S::ID/64 on exn0 and its own control socket. It waits until exn0
// is up everywhere and every node's fabric has a session to every other
// (NetNodes.WaitPeers). extra flags are appended to every exnd.
func StartNetCluster(t testing.TB, exnd string, subnet int, ids []int, extra ...string) *NetCluster {
	t.Helper()
	return StartUnderlayCluster(t, exnd, "net", NetPort, subnet, ids, extra...)
}

// StartNetClusterEach is StartNetCluster with flags of each node's own:
// each(id) is appended to node id's exnd (a --control there becomes
// Node.Control).
func StartNetClusterEach(t testing.TB, exnd string, subnet int, ids []int, each func(id int) []string) *NetCluster {
	t.Helper()
	return startUnderlay(t, exnd, "net", NetPort, subnet, ids, each)
}

// StartUnderlayCluster is StartNetCluster for any fabric that reaches its
// peers over the underlay: "net" (each node listens on its underlay
// address and port) or a spec used as is, such as "ofi:tcp" (the peers
// file then carries the underlay address and port of every node, which
// the backend binds and dials).
func StartUnderlayCluster(t testing.TB, exnd, fabric string, port, subnet int, ids []int, extra ...string) *NetCluster {
	t.Helper()
	return startUnderlay(t, exnd, fabric, port, subnet, ids, func(int) []string { return extra })
}

// startUnderlay is StartUnderlayCluster with each(id) the extra flags of
// node id.
func startUnderlay(t testing.TB, exnd, fabric string, port, subnet int, ids []int, each func(id int) []string) *NetCluster {
	t.Helper()
	c := &NetCluster{Underlay: NewUnderlay(t, subnet), Peers: filepath.Join(t.TempDir(), "peers")}
	var peers strings.Builder
	fmt.Fprintf(&peers, "# exnt %s cluster, underlay 10.78.%d.0/24\n", fabric, subnet)
	for _, id := range ids {
		n := &Node{NS: NewNetns(t, "n"+strconv.Itoa(id)+"-"), ID: id,
			IP: NodeIP(subnet, id), IP6: NodeIP6(subnet, id),
			Control: filepath.Join(t.TempDir(), "exnd.sock")}
		ul := c.Underlay.Attach(t, n.NS, id)
		listen := fmt.Sprintf("%s:%d", ul, port)
		n.Fabric = fabric
		if fabric == "net" {
			n.Fabric = "net:" + listen
		}
		fmt.Fprintf(&peers, "%d %s %s\n", id, listen, n.IP)
		c.Nodes = append(c.Nodes, n)
	}
	if err := os.WriteFile(c.Peers, []byte(peers.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		n.args = append([]string{exnd, "--node-id", strconv.Itoa(n.ID), "--fabric", n.Fabric, "--peers", c.Peers,
			"--addr", n.IP.String() + "/24," + n.IP6.String() + "/64", "--control", n.Control}, each(n.ID)...)
		n.Control = controlFlag(n.args)
		n.Start(t)
	}
	if err := c.WaitPeers(10*time.Second, c.Nodes...); err != nil {
		t.Fatal(err)
	}
	return c
}

// WaitPeers waits until each of nodes has a live fabric session to each
// other of nodes (the "liveness" control operation's "up" list).
func (c *NetCluster) WaitPeers(timeout time.Duration, nodes ...*Node) error {
	return Eventually(timeout, func() error {
		for _, a := range nodes {
			up, err := a.FabricPeers()
			if err != nil {
				return fmt.Errorf("node %d: %w", a.ID, err)
			}
			for _, b := range nodes {
				if b != a && !containsInt(up, b.ID) {
					return fmt.Errorf("node %d: fabric peers %v, want %d among them", a.ID, up, b.ID)
				}
			}
		}
		return nil
	})
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Call sends one control operation to the node's exnd (its control
// socket is a file, reachable from the test's own namespace) and decodes
// the reply's data into out (if not nil). It gives up after 10 s.
func (n *Node) Call(out any, op string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, n.Control)
	if err != nil {
		return fmt.Errorf("node %d: %w", n.ID, err)
	}
	defer c.Close()
	if err := c.Call(ctx, out, op, args...); err != nil {
		return fmt.Errorf("node %d: %s: %w", n.ID, op, err)
	}
	return nil
}

// FabricPeers returns the peers the node's exnd sees up (control
// operation "liveness").
func (n *Node) FabricPeers() ([]int, error) {
	var s struct {
		Up []int `json:"up"`
	}
	err := n.Call(&s, "liveness")
	return s.Up, err
}

// SeenDown polls nodes every poll until none of them lists node id among
// its fabric peers (the "liveness" operation) and returns how long that
// took, or an error naming the nodes that still list it after limit.
func SeenDown(nodes []*Node, id int, poll, limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	left := slices.Clone(nodes)
	for {
		var err error
		left = slices.DeleteFunc(left, func(n *Node) bool {
			up, e := n.FabricPeers()
			if e != nil {
				err = e
				return false
			}
			return !slices.Contains(up, id)
		})
		if len(left) == 0 {
			return time.Since(t0), nil
		}
		if time.Since(t0) > limit {
			ids := make([]int, len(left))
			for i, n := range left {
				ids[i] = n.ID
			}
			return 0, fmt.Errorf("after %v, nodes %v still list node %d as up (last error: %v)", limit, ids, id, err)
		}
		time.Sleep(poll)
	}
}
