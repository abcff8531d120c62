package extds

// Direct connections (docs/direct.md): two programs under the shim on
// nodes of one shm fabric exchange bytes through a shared buffer that the
// accepting node's exnd makes, with no EXT-DS Conn in either exnd. This
// file holds only the agreement, in the shadow handshake (handshake.go):
//
//	client                                    server
//	hello, flags = flagDirect  ─────────────→ create() makes the buffer
//	                           ←───────────── reply, status = statusDirect,
//	                                           node, token, ID, ring size
//	open(info) maps it; ack {token} ────────→ done: both return DirectInfo
//
// A server that cannot or will not make one (no create hook, create
// fails) answers the ordinary reply and the connection is an EXT-DS Conn
// as before; a client that did not offer never gets a direct reply (it
// would be a handshake error). Neither side writes anything into the
// shadow connection after the ack: it is the application's from there.

import (
	"context"
	"io"
	"net"

	"github.com/exn-project/exn/fabric"
)

// DirectInfo names a direct connection's shared buffer: the accepting
// node, a 32-bit token it chose (also the ack's value) and a 64-bit ID
// that names the buffer's files, and the ring size per direction.
type DirectInfo struct {
	Node  fabric.NodeID
	Token uint32
	ID    uint64
	Ring  uint32
}

// UpgradeDirect is Upgrade for a client that can take a direct connection
// (its hello offers one). If the server makes one, open is called with
// its name before the ack; when open succeeds the result is (nil, info,
// nil) and nothing of the connection lives in the Device: the caller
// keeps shadow, whose stream starts after the handshake. If open fails
// the handshake fails (the error wraps open's). Otherwise the results are
// Upgrade's. open runs on the caller's goroutine.
func (d *Dialer) UpgradeDirect(ctx context.Context, shadow net.Conn, open func(DirectInfo) error) (*Conn, *DirectInfo, error) {
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

// serverDirect answers a hello that offers a direct connection. ok false
// with a nil error: create failed and the caller goes on with the
// ordinary reply (nothing was written).
func (d *Device) serverDirect(raw net.Conn, b *[helloLen]byte, create func() (DirectInfo, error)) (*DirectInfo, bool, error) {
	di, err := create()
	if err != nil {
		d.rlog.warn("extds: cannot make a direct connection, using the relay", "err", err)
		return nil, false, nil
	}
	r := hello{status: statusDirect, node: d.att.Node(), conn: di.Token, ring: fabric.NLA(di.ID), ringSize: di.Ring}
	r.encode(b[:], magicReply)
	if _, err := raw.Write(b[:]); err != nil {
		d.ctr.handshakeErr.Add(1)
		return nil, true, err
	}
	var a [ackLen]byte
	if _, err := io.ReadFull(raw, a[:]); err != nil {
		d.ctr.handshakeErr.Add(1)
		return nil, true, err
	}
	if err := decodeAck(a[:], di.Token); err != nil {
		d.ctr.handshakeErr.Add(1)
		return nil, true, err
	}
	return &di, true, nil
}
