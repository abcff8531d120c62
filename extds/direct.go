package extds

// Direct connections (docs/direct.md): two programs under the shim on
// nodes of one shm fabric exchange bytes through a shared buffer that the
// accepting node's exnd makes, with no EXT-DS Conn in either exnd. This
// file holds only the agreement, in the shadow handshake (handshake.go):
//
//	client                                    server
//	offer: hello, flags = FlagDirect,
//	       node only (no ring yet) ────────→ create() makes the buffer
//	                           ←───────────── reply, status = StatusDirect,
//	                                           node, token, ID, ring size
//	open(info) maps it; ack {token} ────────→ done: both return DirectInfo
//
// A server that cannot or will not make one (no create hook, create
// fails) answers StatusNeedRing; the client then registers its ring and
// the ordinary handshake follows (one round trip more, only then), and
// the connection is an EXT-DS Conn as before. So a direct connection
// costs no EXT-DS ring in either exnd. A client that did not offer never
// gets a direct reply (it would be a handshake error). Neither side
// writes anything into the shadow connection after the ack: it is the
// application's from there.

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// DirectInfo names a direct connection's shared buffer: the accepting
// node (Node), a 32-bit token it chose (Token, also the ack's value) and
// a 64-bit ID that names the buffer's files (ID), and the ring size per
// direction (Ring). The type is the agreement's (internal/agree), which
// also makes one over the fabric (Claim.AgreeDirect).
type DirectInfo = agree.DirectInfo

// UpgradeDirect is Upgrade for a client that can take a direct connection
// (its hello offers one). If the server makes one, open is called with
// its name before the ack; when open succeeds the result is (nil, info,
// nil) and nothing of the connection lives in the Device: the caller
// keeps shadow, whose stream starts after the handshake. If open fails
// the handshake fails (the error wraps open's). Otherwise the results are
// Upgrade's. open runs on the caller's goroutine.
func (d *Dialer) UpgradeDirect(ctx context.Context, shadow net.Conn, open func(*DirectInfo) error) (*Conn, *DirectInfo, error) {
	c, di, err := d.upgradeDirect(ctx, shadow, shadow.RemoteAddr().String(), open)
	if err != nil {
		abandon(shadow)
		return nil, nil, &net.OpError{Op: "upgrade", Net: "extds", Source: shadow.LocalAddr(), Addr: shadow.RemoteAddr(), Err: err}
	}
	return c, di, nil
}

// AcceptShadowDirect is AcceptShadow for an acceptor that can take a
// direct connection: when the client's hello offers one, create makes the
// buffer and returns its name, and after the client's ack the result is
// (nil, info, nil). When create fails, the connection goes on as
// AcceptShadow's. The caller owns what create made and removes it if the
// result is not a DirectInfo.
func (d *Device) AcceptShadowDirect(ctx context.Context, shadow net.Conn, peeked []byte, create func() (DirectInfo, error)) (*Conn, *DirectInfo, error) {
	return d.acceptShadow(ctx, shadow, peeked, create)
}

// serverDirect answers a direct offer: with a direct connection if
// create makes one (the result is then its DirectInfo after the client's
// ack), otherwise with StatusNeedRing, and then it reads and returns the
// client's ordinary hello.
func (d *Device) serverDirect(raw net.Conn, b *[wire.HelloLen]byte, create func() (DirectInfo, error)) (wire.Hello, *DirectInfo, error) {
	fail := func(err error) (wire.Hello, *DirectInfo, error) {
		d.ctr.handshakeErr.Add(1)
		return wire.Hello{}, nil, err
	}
	if create != nil {
		di, err := create()
		if err == nil {
			r := wire.Hello{Status: wire.StatusDirect, Node: d.att.Node(), Conn: di.Token, Ring: fabric.NLA(di.ID), RingSize: di.Ring}
			r.Encode(b[:], wire.MagicReply)
			if _, err := raw.Write(b[:]); err != nil {
				return fail(err)
			}
			var a [wire.AckLen]byte
			if _, err := io.ReadFull(raw, a[:]); err != nil {
				return fail(err)
			}
			if err := wire.DecodeAck(a[:], di.Token); err != nil {
				return fail(err)
			}
			return wire.Hello{}, &di, nil
		}
		d.rlog.warn("extds: cannot make a direct connection, using the relay", "err", err)
	}
	(&wire.Hello{Status: wire.StatusNeedRing}).Encode(b[:], wire.MagicReply)
	if _, err := raw.Write(b[:]); err != nil {
		return fail(err)
	}
	if _, err := io.ReadFull(raw, b[:]); err != nil {
		return fail(err)
	}
	h, err := wire.DecodeHello(b[:], wire.MagicHello)
	if err == nil && (h.Status != wire.StatusOK || h.Ring == 0) {
		err = fmt.Errorf("second hello is not an ordinary one: %w", wire.ErrHandshake)
	}
	if err != nil {
		return fail(err)
	}
	return h, nil, nil
}

// clientDirect sends a direct offer and reads the answer: a DirectInfo
// (opened with open and acked), or (nil, nil) when the server asks for
// the ordinary hello, or errPeerNoFab.
func (d *Device) clientDirect(ctx context.Context, raw net.Conn, node fabric.NodeID, open func(*DirectInfo) error) (*DirectInfo, error) {
	stop := handshakeDeadline(ctx, raw, d.cfg.handshakeTO)
	defer stop()
	h, err := askHello(raw, &wire.Hello{Flags: wire.FlagDirect, Node: d.att.Node()})
	if err != nil {
		return nil, err
	}
	switch h.Status {
	case wire.StatusNeedRing:
		return nil, nil
	case wire.StatusDirect:
	default:
		return nil, fmt.Errorf("reply status %d to a direct offer: %w", h.Status, wire.ErrHandshake)
	}
	if err := checkNode(&h, node); err != nil {
		return nil, err
	}
	di := &DirectInfo{Node: h.Node, Token: h.Conn, ID: uint64(h.Ring), Ring: h.RingSize}
	if err := open(di); err != nil {
		return nil, fmt.Errorf("open direct buffer: %w", err)
	}
	if err := ackReply(ctx, raw, h.Conn, stop); err != nil {
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return di, nil
}

// PeerAlive reports whether the fabric considers node alive (nil) or
// down (an error wrapping fabric.ErrPeerDown or the fabric's reason): the
// liveness a direct connection's owner checks, since no EXT-DS Conn of
// this Device watches its peer.
func (d *Device) PeerAlive(node fabric.NodeID) error { return d.att.Alive(node) }

// PeersChanged is the fabric's fabric.PeerWatcher channel (closed at the
// next change of the peer set), or nil when the Attachment cannot
// announce changes: a caller that watches PeerAlive then polls.
func (d *Device) PeersChanged() <-chan struct{} {
	if w, ok := d.att.(fabric.PeerWatcher); ok {
		return w.PeersChanged()
	}
	return nil
}
