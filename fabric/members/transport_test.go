package members

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// ownTransport makes a Transport with its own listener on a free
// loopback port (as fabric/ofi uses it), for peers.
func ownTransport(t *testing.T, peers []string) (*Transport, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
	if err != nil {
		ln.Close()
		t.Skipf("udp port %v taken: %v", ap, err)
	}
	tr, err := NewTransport(TransportConfig{UDP: udp, Listener: ln, Advertise: ap, Peers: peers, StreamMagic: "EXNM"})
	if err != nil {
		t.Fatal(err)
	}
	return tr, ap.String()
}

// TestTransport: two nodes on Transports with their own listeners join
// and see each other; a datagram and a stream from outside the peers
// (127.0.0.2) and a stream without the magic are refused and counted;
// Close stops every goroutine.
func TestTransport(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	// 127.0.0.1 is the only peer IP: both nodes use it.
	peers := []string{"127.0.0.1:1"}
	var ms [2]*Members
	var trs [2]*Transport
	var addrs [2]string
	for i := range ms {
		tr, a := ownTransport(t, peers)
		m, err := New(Config{Node: fabric.NodeID(i + 1), Transport: tr})
		if err != nil {
			tr.Shutdown()
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		tr.Start()
		ms[i], trs[i], addrs[i] = m, tr, a
	}
	down := make(chan struct{})
	defer close(down)
	ms[1].JoinLoop([]string{addrs[0]}, down)
	for _, m := range ms {
		testenv.Eventually(t, "joined", 10*time.Second, func() bool { return len(m.Peers()) == 1 })
	}
	to := netip.MustParseAddrPort(addrs[0])
	if c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)}, net.UDPAddrFromAddrPort(to)); err == nil {
		c.Write([]byte("forged"))
		c.Close()
	} else {
		t.Skipf("cannot bind 127.0.0.2: %v", err)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: time.Second}
	c, err := d.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("EXNM"))
	defer c.Close()
	bad, err := net.Dial("tcp", addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte("HTTP"))
	defer bad.Close()
	testenv.Eventually(t, "three refusals", 10*time.Second, func() bool { return trs[0].Stats().Foreign == 3 })
	if s := trs[0].Stats(); s.Streams == 0 {
		t.Errorf("no stream counted for the join: %+v", s)
	}
	if !ms[0].Alive(2) {
		t.Error("node 2 not alive after the forgeries")
	}
}

// TestTransportConfig: a Transport without a socket, an address or a
// 4-byte magic is refused.
func TestTransportConfig(t *testing.T) {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	ap := netip.MustParseAddrPort("127.0.0.1:1")
	for _, cfg := range []TransportConfig{
		{Advertise: ap, StreamMagic: "EXNM"},
		{UDP: udp, StreamMagic: "EXNM"},
		{UDP: udp, Advertise: ap, StreamMagic: "EXN"},
	} {
		if _, err := NewTransport(cfg); !errors.Is(err, fabric.ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", cfg, err)
		}
	}
}
