package fabnet

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// TestSWIMDeadNodeLosesSession: a node whose membership stops answering
// while its sessions stay open (a frozen host: nothing closes the TCP
// connections) is declared dead by the others' SWIM, and they drop its
// session; the heartbeat is not what finds it (there is none).
func TestSWIMDeadNodeLosesSession(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nics := cluster(t, 3, eager)
	waitSessions(t, nics, 2)
	waitMembers(t, nics)
	changed := nics[0].PeersChanged()
	nics[2].members.Close() // no leave: the others must find out
	for _, n := range nics[:2] {
		waitUntil(t, "the silent node's session dropped", func() bool { return errors.Is(n.Alive(3), fabric.ErrPeerDown) })
		if s := n.NetStats(); s.SWIMDown != 1 || s.HeartbeatTimeouts != 0 {
			t.Errorf("node %d: SWIMDown %d, HeartbeatTimeouts %d; want 1, 0", n.id, s.SWIMDown, s.HeartbeatTimeouts)
		}
	}
	// The table changes when the killed session's goroutines are done,
	// just after Alive turned.
	testenv.Within(t, "PeersChanged after the session dropped", changed, 5*time.Second)
	if err := nics[0].Alive(2); err != nil {
		t.Errorf("the live node: %v", err)
	}
}

// TestSWIMForeign: membership datagrams and streams from an address
// outside the peers table are refused and counted, and the node stays up.
func TestSWIMForeign(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nics := cluster(t, 2, nil)
	n := nics[0]
	to := n.swim.LocalAddr().(*net.UDPAddr)
	// 127.0.0.2 is local on Linux, and no peers entry names it.
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}, to)
	if err != nil {
		t.Skipf("cannot bind 127.0.0.2: %v", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("forged membership message")); err != nil {
		t.Fatal(err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: time.Second}
	s, err := d.Dial("tcp", n.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write([]byte(swimMagic)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "both refused", func() bool { return n.NetStats().SWIMForeign == 2 })
	if err := n.Alive(2); err != nil {
		t.Errorf("the peer after the forgeries: %v", err)
	}
}

// TestPeersChanged: the channel closes when a session comes up.
func TestPeersChanged(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	nics := cluster(t, 2, nil)
	ch := nics[0].PeersChanged()
	select {
	case <-ch:
		t.Fatal("closed with no change")
	default:
	}
	nics[1].Close()
	testenv.Within(t, "PeersChanged after the peer closed", ch, 10*time.Second)
	if p := nics[0].Peers(); len(p) != 0 {
		t.Errorf("Peers %v after the only peer closed", p)
	}
}

// waitMembers waits until every node's membership sees all of them.
func waitMembers(t testing.TB, nics []*NIC) {
	t.Helper()
	for _, n := range nics {
		waitUntil(t, "membership converged", func() bool { return len(n.members.Peers()) == len(nics)-1 })
	}
}

// eager is a cluster mod for tests of what happens to sessions: every
// pair has one from the start.
func eager(c *Config) { c.Sessions = SessionsEager }

// waitSessions waits until every node has k live sessions.
func waitSessions(t testing.TB, nics []*NIC, k int) {
	t.Helper()
	for _, n := range nics {
		waitUntil(t, "sessions up", func() bool { return n.NetStats().Sessions == k })
	}
}
