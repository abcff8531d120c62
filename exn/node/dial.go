package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// parseAddr splits "host:port" where host is an IP literal (no name
// resolution: the fabric has no DNS) or empty (any address). It returns the
// gVisor address and the network protocol: IPv6 for an IPv6 host or a "6"
// network, else IPv4.
func parseAddr(network, address string) (tcpip.FullAddress, tcpip.NetworkProtocolNumber, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return tcpip.FullAddress{}, 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return tcpip.FullAddress{}, 0, fmt.Errorf("port %q: %w", port, err)
	}
	fa := tcpip.FullAddress{NIC: nicID, Port: uint16(p)}
	proto := ipv4.ProtocolNumber
	if network[len(network)-1] == '6' {
		proto = ipv6.ProtocolNumber
	}
	if host == "" {
		fa.NIC = 0
		return fa, proto, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return tcpip.FullAddress{}, 0, fmt.Errorf("host %q: want an IP literal: %w", host, err)
	}
	ip = ip.Unmap()
	switch {
	case ip.Is4() && network[len(network)-1] == '6':
		return tcpip.FullAddress{}, 0, fmt.Errorf("%s address on network %s", ip, network)
	case ip.Is6() && network[len(network)-1] == '4':
		return tcpip.FullAddress{}, 0, fmt.Errorf("%s address on network %s", ip, network)
	case ip.Is6():
		proto = ipv6.ProtocolNumber
	}
	fa.Addr = tcpip.AddrFromSlice(ip.AsSlice())
	if ip.IsUnspecified() {
		fa.Addr = tcpip.Address{}
		fa.NIC = 0
	}
	return fa, proto, nil
}

func opErr(op, network, address string, err error) error {
	return &net.OpError{Op: op, Net: network, Addr: stringAddr{network, address}, Err: err}
}

type stringAddr struct{ net, addr string }

func (a stringAddr) Network() string { return a.net }
func (a stringAddr) String() string  { return a.addr }

// DialContext connects to address on the named network ("tcp", "tcp4",
// "tcp6", "udp", "udp4", "udp6") through the node's stack. The host must be
// an IP literal. TCP dials block until the handshake completes, ctx is done
// or the node closes. The conn is a gonet conn: it honours deadlines, and
// Close of the node makes its blocked calls fail.
func (n *Node) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if n.isClosed() {
		return nil, opErr("dial", network, address, net.ErrClosed)
	}
	switch network {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
	default:
		return nil, opErr("dial", network, address, net.UnknownNetworkError(network))
	}
	fa, proto, err := parseAddr(network, address)
	if err != nil {
		return nil, opErr("dial", network, address, err)
	}
	if fa.Addr.BitLen() == 0 {
		return nil, opErr("dial", network, address, errors.New("missing host"))
	}
	if network[0] == 't' {
		// Cancel the dial when the node closes, too.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(n.ctx, cancel)
		defer stop()
		c, err := gonet.DialContextTCP(ctx, n.stack, fa, proto)
		if err != nil {
			if n.isClosed() {
				return nil, opErr("dial", network, address, net.ErrClosed)
			}
			return nil, err
		}
		return c, nil
	}
	c, err := gonet.DialUDP(n.stack, nil, &fa, proto)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// listenBacklog is the accept queue of a Listen.
const listenBacklog = 1024

// Listen listens for TCP connections ("tcp", "tcp4", "tcp6") on address,
// "host:port" with an IP literal, or an empty or unspecified host for every
// address. As with package net, "tcp" with an empty host is dual-stack
// (when the node has an IPv6 address) and "tcp6" is IPv6 only. Close of the
// node closes the listener: a blocked Accept returns an error.
func (n *Node) Listen(network, address string) (net.Listener, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, opErr("listen", network, address, net.UnknownNetworkError(network))
	}
	fa, proto, err := parseAddr(network, address)
	if err != nil {
		return nil, opErr("listen", network, address, err)
	}
	if n.isClosed() {
		return nil, opErr("listen", network, address, net.ErrClosed)
	}
	dual := network == "tcp" && fa.Addr.BitLen() == 0 && n.addr6.IsValid()
	if dual {
		proto = ipv6.ProtocolNumber
	}
	var wq waiter.Queue
	ep, terr := n.stack.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if terr != nil {
		return nil, stackErr("listen", network, address, terr)
	}
	if proto == ipv6.ProtocolNumber {
		ep.SocketOptions().SetV6Only(!dual)
	}
	if terr := ep.Bind(fa); terr != nil {
		ep.Close()
		return nil, stackErr("listen", network, address, terr)
	}
	if terr := ep.Listen(listenBacklog); terr != nil {
		ep.Close()
		return nil, stackErr("listen", network, address, terr)
	}
	return keep[net.Listener](n, network, address, &listener{TCPListener: gonet.NewTCPListener(n.stack, &wq, ep), n: n})
}

// stackErr is opErr for an error of the gVisor stack.
func stackErr(op, network, address string, terr tcpip.Error) error {
	return opErr(op, network, address, errors.New(terr.String()))
}

// keep hands c to the caller once the node tracks it (Close of the node
// closes it); a closed node closes c and answers net.ErrClosed.
func keep[C closer](n *Node, network, address string, c C) (C, error) {
	if err := n.track(c); err != nil {
		var none C
		return none, opErr("listen", network, address, err)
	}
	return c, nil
}

type listener struct {
	*gonet.TCPListener
	n *Node
}

// Close closes the listener and forgets it.
func (l *listener) Close() error {
	l.n.untrack(l)
	return l.TCPListener.Close()
}

// ListenPacket opens a datagram endpoint: "udp", "udp4", "udp6" bound to
// address ("host:port", empty host for any address), or "ping4"/"ping6"
// for an ICMP echo socket (the port is the echo identifier; write an echo
// request header plus payload to a *net.UDPAddr whose port is ignored,
// read echo replies). Close of the node closes it.
func (n *Node) ListenPacket(network, address string) (net.PacketConn, error) {
	if n.isClosed() {
		return nil, opErr("listen", network, address, net.ErrClosed)
	}
	var c *gonet.UDPConn
	switch network {
	case "udp", "udp4", "udp6":
		fa, proto, err := parseAddr(network, address)
		if err != nil {
			return nil, opErr("listen", network, address, err)
		}
		c, err = gonet.DialUDP(n.stack, &fa, nil, proto)
		if err != nil {
			return nil, err
		}
	case "ping4", "ping6":
		tp, np := icmp.ProtocolNumber4, ipv4.ProtocolNumber
		if network == "ping6" {
			tp, np = icmp.ProtocolNumber6, ipv6.ProtocolNumber
		}
		var wq waiter.Queue
		ep, terr := n.stack.NewEndpoint(tp, np, &wq)
		if terr != nil {
			return nil, stackErr("listen", network, address, terr)
		}
		if address != "" {
			fa, _, err := parseAddr(network, address)
			if err != nil {
				ep.Close()
				return nil, opErr("listen", network, address, err)
			}
			if terr := ep.Bind(fa); terr != nil {
				ep.Close()
				return nil, stackErr("listen", network, address, terr)
			}
		}
		c = gonet.NewUDPConn(&wq, ep)
	default:
		return nil, opErr("listen", network, address, net.UnknownNetworkError(network))
	}
	return keep[net.PacketConn](n, network, address, &packetConn{UDPConn: c, n: n})
}

type packetConn struct {
	*gonet.UDPConn
	n *Node
}

// Close closes the conn and forgets it.
func (c *packetConn) Close() error {
	c.n.untrack(c)
	return c.UDPConn.Close()
}

// Ping sends one ICMP echo request to dst through the stack and waits for
// the matching reply, ctx or the node's Close. It returns the round-trip
// time.
func (n *Node) Ping(ctx context.Context, dst netip.Addr, payload []byte) (time.Duration, error) {
	network, typ := "ping4", byte(header.ICMPv4Echo)
	if dst.Is6() {
		network, typ = "ping6", byte(header.ICMPv6EchoRequest)
	}
	pc, err := n.ListenPacket(network, "")
	if err != nil {
		return 0, err
	}
	defer pc.Close()
	if d, ok := ctx.Deadline(); ok {
		pc.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { pc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	const seq = 1
	req := make([]byte, header.ICMPv4MinimumSize+len(payload))
	req[0] = typ
	binary.BigEndian.PutUint16(req[6:8], seq)
	copy(req[header.ICMPv4MinimumSize:], payload)
	to := &net.UDPAddr{IP: dst.AsSlice()}
	start := time.Now()
	if _, err := pc.WriteTo(req, to); err != nil {
		return 0, fmt.Errorf("ping %s: %w", dst, err)
	}
	buf := make([]byte, len(req)+64)
	for {
		m, _, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("ping %s: %w", dst, ctx.Err())
			}
			return 0, fmt.Errorf("ping %s: %w", dst, err)
		}
		// The ping endpoint rewrites the identifier; match type and seq.
		if m >= header.ICMPv4MinimumSize && binary.BigEndian.Uint16(buf[6:8]) == seq &&
			(buf[0] == byte(header.ICMPv4EchoReply) || buf[0] == byte(header.ICMPv6EchoReply)) {
			return time.Since(start), nil
		}
	}
}
