//go:build ofi && cgo

package ofi

// Membership (Config.Liveness = LivenessSWIM; issue #36, docs/fabric-ofi.md
// "Membership"). The backend's own liveness sees a peer down only when
// it says goodbye or a send to it fails, so a peer that froze or whose
// host vanished while idle went unseen until used. With membership:
//
//	members.Transport (fabric/members/transport.go) on this node's
//	   peers-file IP, port + MembershipPortOffset, UDP and its own TCP
//	   listener; datagrams and streams only from the peers' IPs
//	OnChange(node, dead) ──► peerDown(p, whyMembership): blocked senders,
//	   pending queries and cached regions are released, as after a
//	   failed send
//	OnChange(node, alive) ──► peerUp(p) if it was down (it runs again)
//	joinLoop: members.JoinLoop through the peers (in n.wg, ends at
//	   n.done)
//
// Close leaves the membership first (peers mark this node left at once),
// then says goodbye as before.

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/members"
)

const (
	// membershipMagic opens a membership stream.
	membershipMagic = "EXNM"
	// leaveTimeout bounds how long Close waits for its leave to spread.
	leaveTimeout = 250 * time.Millisecond
	// whyMembership is the peerDown reason of a node membership
	// declared dead.
	whyMembership = "declared dead by membership"
)

// membershipAddr is the membership address beside a peers-file address.
func membershipAddr(addr string) (netip.AddrPort, error) {
	host, port := splitHostPort(addr)
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("ofi: membership needs an IP address, not %q: %w", addr, fabric.ErrInvalid)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p <= 0 || p+MembershipPortOffset > 65535 {
		return netip.AddrPort{}, fmt.Errorf("ofi: membership port beside %q: %w", addr, fabric.ErrInvalid)
	}
	return netip.AddrPortFrom(ip.Unmap(), uint16(p+MembershipPortOffset)), nil
}

// startMembers starts membership and its join loop. Called by open
// after the peers are in the address vector.
func (n *NIC) startMembers() error {
	host, port, _ := bindAddr(&n.cfg)
	if host == "" {
		return fmt.Errorf("ofi: membership needs this node's address in the peers file (or Bind): %w", fabric.ErrInvalid)
	}
	adv, err := membershipAddr(net.JoinHostPort(host, port))
	if err != nil {
		return err
	}
	var seeds []string
	for _, p := range n.cfg.Peers {
		if p.Node == n.id {
			continue
		}
		a, err := membershipAddr(p.Addr)
		if err != nil {
			return fmt.Errorf("ofi: peer %d: %w", p.Node, err)
		}
		seeds = append(seeds, a.String())
	}
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(adv))
	if err != nil {
		return fmt.Errorf("ofi: membership socket: %w", err)
	}
	ln, err := net.Listen("tcp", adv.String())
	if err != nil {
		udp.Close()
		return fmt.Errorf("ofi: membership listener: %w", err)
	}
	t, err := members.NewTransport(members.TransportConfig{UDP: udp, Listener: ln, Advertise: adv, Peers: seeds,
		StreamMagic: membershipMagic, Logger: n.log})
	if err != nil {
		udp.Close()
		ln.Close()
		return err
	}
	m, err := members.New(members.Config{Node: n.id, Transport: t, Profile: n.cfg.SWIM, Logger: n.log, OnChange: n.memberChanged})
	if err != nil {
		t.Shutdown()
		return err
	}
	n.members, n.mtransport = m, t
	t.Start()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		m.JoinLoop(seeds, n.done)
	}()
	return nil
}

// memberChanged is members.Config.OnChange.
func (n *NIC) memberChanged(node fabric.NodeID, alive bool) {
	p := n.peer(node)
	if p == nil || node == n.id {
		return
	}
	if alive {
		n.peerUp(p)
		return
	}
	n.declaredDead.Add(1)
	p.deadByMembership.Store(true) // before down: receive checks it when down
	n.peerDown(p, whyMembership)
}

// MembershipStats reports membership's counters; false without
// membership.
func (n *NIC) MembershipStats() (members.Report, bool) {
	if n.members == nil {
		return members.Report{}, false
	}
	return members.Report{Transport: n.mtransport.Stats(), Members: n.members.Stats(), DeclaredDead: n.declaredDead.Load(),
		FromDead: n.fromDead.Load()}, true
}
