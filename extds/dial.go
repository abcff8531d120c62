package extds

// The client side: Dialer dials the shadow connection and turns it into
// an EXT-DS Conn (handshake.go) or a TCP fallback (fallback.go). Before
// anything is written into the socket, the peer is resolved to a node
// and the server's acceptor must claim the 4-tuple (internal/agree);
// otherwise the application gets the plain socket as it is. A Dialer
// holds no state of its own and no locks; the Agent's negative cache
// has its own.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
	"github.com/exn-project/exn/fabric"
)

// portOf extracts the port of a TCP address.
func portOf(a net.Addr) (uint16, bool) {
	if t, ok := a.(*net.TCPAddr); ok {
		return uint16(t.Port), true
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return 0, false
	}
	return ap.Port(), true
}

// addrPortOf is a TCP address as a netip.AddrPort.
func addrPortOf(a net.Addr) (netip.AddrPort, bool) {
	t, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := t.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ap.IsValid()
}

func ipOf(a net.Addr) (netip.Addr, bool) {
	if t, ok := a.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(t.IP)
		return ip.Unmap(), ok
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// Dialer dials EXT-DS connections, falling back to TCP.
type Dialer struct {
	// Device is the fabric attachment; nil means always TCP.
	Device *Device
	// Resolver overrides the Device's resolver.
	Resolver Resolver
	// DialContext dials the shadow connection: net.Dialer's by default
	// (kernel mode, over exn0); exn/node's in netstack mode.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Dial dials address on dev (nil: plain TCP) with a default Dialer.
func Dial(dev *Device, network, address string) (*Conn, error) {
	return (&Dialer{Device: dev}).DialConn(context.Background(), network, address)
}

// DialContext is Dial with a context.
func DialContext(ctx context.Context, dev *Device, network, address string) (*Conn, error) {
	return (&Dialer{Device: dev}).DialConn(ctx, network, address)
}

// Dial is DialConn returning a net.Conn, with the signature of
// http.Transport.DialContext.
func (d *Dialer) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.DialConn(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (d *Dialer) dialRaw(ctx context.Context, network, address string) (net.Conn, error) {
	if d.DialContext != nil {
		return d.DialContext(ctx, network, address)
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, address)
}

// DialConn connects to address ("tcp", "tcp4", "tcp6"). The connection
// runs over EXT-DS when the resolver places the peer on the fabric, the
// peer node's Device has a listener registered for the port (probe) and
// the peer answers the handshake, and over TCP otherwise; the caller sees
// no error for a fallback (Mode, FallbackReason and Stats tell). A refused
// or unreachable address is an error, as with net.Dial.
func (d *Dialer) DialConn(ctx context.Context, network, address string) (*Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	raw, err := d.dialRaw(ctx, network, address)
	if err != nil {
		return nil, err
	}
	c, err := d.upgrade(ctx, raw, address)
	switch {
	case err == nil:
		return c, nil
	case errors.Is(err, errNoAnswer):
		// Not an EXT-DS server after all (it registered the port but did
		// not answer): our hello is in its stream, so use a fresh
		// connection.
		raw.Close()
		raw, err = d.dialRaw(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return d.Device.fallback(raw, nil, FallbackHandshake), nil
	}
	raw.Close()
	return nil, &net.OpError{Op: "dial", Net: network, Addr: raw.RemoteAddr(), Err: err}
}

// Upgrade turns an already connected TCP socket (the shadow) into an
// EXT-DS connection from the client side, as DialConn does after its dial:
// resolve the peer IP, probe the peer node for a listener on the remote
// port, and run the handshake over shadow. exnd's shim server uses it for
// a socket an application connected itself.
//
//   - EXT-DS: a *Conn in ModeEXTDS that owns shadow (kept as the liveness
//     aid or closed, per WithShadow).
//   - Fallback before anything was written (no Device, no route, no
//     listener, cached) or after the server said it cannot attach: a
//     *Conn in ModeTCP wrapping shadow, whose stream is exactly as the
//     application left it. FallbackReason says why.
//   - Error: ctx ended, or the handshake failed after the hello was
//     written. The stream is then unusable, so Upgrade shuts shadow down
//     in both directions; the caller still closes it. With the probe in
//     front, this takes a server that registered the port and then did not
//     answer.
func (d *Dialer) Upgrade(ctx context.Context, shadow net.Conn) (*Conn, error) {
	c, err := d.upgrade(ctx, shadow, shadow.RemoteAddr().String())
	if err != nil {
		abandon(shadow)
		return nil, &net.OpError{Op: "upgrade", Net: "extds", Source: shadow.LocalAddr(), Addr: shadow.RemoteAddr(), Err: err}
	}
	return c, nil
}

// errNoAnswer: the handshake failed after our hello went out.
var errNoAnswer = errors.New("extds: no valid handshake answer")

// upgrade runs the client side over raw. On an error raw is not closed;
// errNoAnswer means the hello was written.
func (d *Dialer) upgrade(ctx context.Context, raw net.Conn, address string) (*Conn, error) {
	c, _, err := d.upgradeDirect(ctx, raw, address, nil)
	return c, err
}

// upgradeDirect is upgrade with a direct offer when open is not nil
// (direct.go): the result is then either a *Conn or, when the server made
// a direct connection and open took it, its DirectInfo.
func (d *Dialer) upgradeDirect(ctx context.Context, raw net.Conn, address string, open func(*DirectInfo) error) (*Conn, *DirectInfo, error) {
	dev := d.Device
	if dev == nil {
		return tcpConn(raw, nil), nil, nil
	}
	res := d.Resolver
	if res == nil {
		res = dev.cfg.resolver
	}
	ip, ok := ipOf(raw.RemoteAddr())
	var node fabric.NodeID
	if ok && res != nil {
		node, ok = res.Resolve(ip)
	} else {
		ok = false
	}
	if !ok {
		return dev.fallback(raw, nil, FallbackNoRoute), nil, nil
	}
	if dev.agree.Negative(address) {
		return dev.fallback(raw, nil, FallbackCached), nil, nil
	}
	lport, _ := portOf(raw.LocalAddr())
	// Out-of-band agreement keyed by the 4-tuple (internal/agree): nothing
	// is written into raw unless the server's acceptor claimed it.
	la, lok := addrPortOf(raw.LocalAddr())
	ra, rok := addrPortOf(raw.RemoteAddr())
	if !lok || !rok {
		return dev.fallback(raw, nil, FallbackNoRoute), nil, nil
	}
	if dev.PeerHold(ra) > 0 {
		return dev.fallback(raw, nil, FallbackShortLived), nil, nil
	}
	ans, di, err := dev.agree.Offer(ctx, node, la, ra, open)
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, nil, ctx.Err()
	case errors.Is(err, agree.ErrCommitUnsent):
		return nil, nil, err // the acceptor fails the connection: so do we
	case err != nil:
		dev.rlog.warn("extds: cannot claim, using tcp", "err", err)
		return dev.fallback(raw, nil, FallbackNoRoute), nil, nil
	case ans == agree.Direct:
		return nil, di, nil // agreed over the fabric (internal/agree/claimdirect.go)
	}
	if ans != agree.Agreed {
		why := offerFallback[ans]
		if why == FallbackNoClaim {
			dev.agree.SetNegative(address) // a listener whose acceptor does not claim: TCP for a while
		}
		return dev.fallback(raw, nil, why), nil, nil
	}
	if open != nil {
		di, err := dev.clientDirect(ctx, raw, node, open)
		switch {
		case err == nil && di != nil:
			return nil, di, nil
		case err == nil:
			// The server asked for the ordinary hello: go on below.
		case errors.Is(err, errPeerNoFab):
			_ = raw.SetDeadline(time.Time{})
			return dev.fallback(raw, nil, FallbackPeerNoFab), nil, nil
		case ctx.Err() != nil:
			return nil, nil, ctx.Err()
		default:
			dev.ctr.handshakeErr.Add(1)
			dev.rlog.warn("extds: direct handshake failed", "addr", address, "err", err)
			dev.agree.SetNegative(address)
			return nil, nil, fmt.Errorf("%w: %w", errNoAnswer, err)
		}
	}
	c, err := dev.newConn(lport, raw)
	if err != nil {
		dev.rlog.warn("extds: cannot attach connection, using tcp", "err", err)
		return dev.fallback(raw, nil, FallbackNoRoute), nil, nil
	}
	_, err = c.clientHandshake(ctx, raw, node)
	switch {
	case err == nil:
		c.start()
		return c, nil, nil
	case errors.Is(err, errPeerNoFab):
		c.discard()
		_ = raw.SetDeadline(time.Time{})
		return dev.fallback(raw, nil, FallbackPeerNoFab), nil, nil
	case ctx.Err() != nil:
		c.discard()
		return nil, nil, ctx.Err()
	}
	c.discard()
	dev.ctr.handshakeErr.Add(1)
	dev.rlog.warn("extds: handshake failed", "addr", address, "err", err)
	dev.agree.SetNegative(address)
	return nil, nil, fmt.Errorf("%w: %w", errNoAnswer, err)
}

// abandon shuts a stream down in both directions (the socket, not just
// this descriptor): after a failed handshake its content is garbage to
// the application.
func abandon(c net.Conn) {
	if cr, ok := c.(interface{ CloseRead() error }); ok {
		_ = cr.CloseRead()
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
