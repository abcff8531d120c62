package extds

// The handshake: how a shadow TCP connection becomes an EXT-DS Conn or
// falls back to TCP (fallback.go). Dialer (dial.go) and Listener
// (listen.go) drive it; Dialer.Upgrade and Device.AcceptShadow run it over
// a socket connected or accepted elsewhere (exnd's shim).
//
// Connection setup over the shadow TCP connection.
//
//	client                                   server (Listener)
//	dial shadow (DialContext)  ───────────→  accept; peek first 4 bytes
//	hello {node,vpid,conn,ring,...} ──────→  (PeekTimeout; not "EXDS" →
//	                                          plain TCP, bytes replayed)
//	                           ←──────────  reply {node,vpid,conn,ring,...}
//	ack {server conn} ────────────────────→  conn established, Accept
//	data over the fabric only; the shadow stays open as a liveness aid
//
// The client registers its connection (ring, ID) before sending hello and
// the server before replying, and the server sends no data before the ack,
// so no fabric message can arrive for a connection that is not ready.
// A server that is not EXT-DS answers nothing (or something else) within
// HandshakeTimeout: the client drops that socket, dials a fresh plain TCP
//
// Locks: a connection in set-up is not yet reachable by the application,
// and by the rx loop only through the Device tables it is entered in
// (newConn, establish, under Device.mu); establish sets the peer fields
// under Conn.mu before it publishes the peer (c.peer), which is what
// makes the rx loop accept the peer's messages. Socket I/O here is
// bounded by HandshakeTimeout and the caller's context, never by a lock.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// newConn allocates an EXT-DS connection on the vdev of port: ID, rx
// ring, tx mirror, eager buffer.
func (d *Device) newConn(port uint16, shadow net.Conn) (*Conn, error) {
	v, err := d.vdev(int(port & 0xF))
	if err != nil {
		return nil, err
	}
	c := &Conn{
		dev: d, cfg: &d.cfg, vd: v, shadow: shadow,
		laddr: shadow.LocalAddr(), raddr: shadow.RemoteAddr(),
		ringSize: uint32(d.cfg.ringSize), eagerWin: uint32(d.cfg.eagerWin),
		done: make(chan struct{}), rdWake: make(chan struct{}, 1), wrWake: make(chan struct{}, 1),
		rdDL: makeDeadline(), wrDL: makeDeadline(), linger: -1,
	}
	c.ctx, c.cancel = context.WithCancel(d.ctx)
	c.eager = make([]byte, d.cfg.eagerWin)
	if c.rxRing, err = v.ep.Register(d.cfg.ringSize); err != nil {
		c.cancel()
		return nil, fmt.Errorf("register rx ring: %w", err)
	}
	if err := d.register(c); err != nil {
		_ = v.ep.Deregister(c.rxRing.NLA)
		c.cancel()
		return nil, err
	}
	d.addRegion(c.rxRing.NLA.Region(), c)
	d.ctr.active.Add(1)
	return c, nil
}

// establish records the peer's handshake and makes c ready to send.
func (c *Conn) establish(h wire.Hello) error {
	tx, err := c.vd.ep.Register(int(h.RingSize))
	if err != nil {
		return fmt.Errorf("register tx ring: %w", err)
	}
	c.mu.Lock()
	c.txRing = tx
	c.peerAddr = fabric.Addr{Node: h.Node, VPID: h.VPID}
	c.peerID, c.peerRing, c.peerRingSize, c.peerEager = h.Conn, h.Ring, h.RingSize, h.EagerWin
	c.txFree, c.txEager = h.RingSize, h.EagerWin
	c.mu.Unlock()
	c.dev.mu.Lock()
	c.dev.regions[tx.NLA.Region()] = c
	c.dev.byPeer[peerKey{c.peerAddr, h.Conn}] = c
	c.dev.mu.Unlock()
	c.peer.Store(uint32(h.Node) | uint32(h.VPID)<<16 | 1<<24)
	return nil
}

func (c *Conn) localHello() wire.Hello {
	return wire.Hello{
		Node: c.dev.att.Node(), VPID: c.vd.ep.Addr().VPID, Conn: c.id,
		Ring: c.rxRing.NLA, RingSize: c.ringSize, EagerWin: c.eagerWin,
	}
}

// discard releases a connection that never got established.
func (c *Conn) discard() {
	c.mu.Lock()
	c.closed = true
	c.err = net.ErrClosed
	c.cancel()
	shadow := c.shadow
	c.shadow = nil // the caller keeps (or closes) the socket
	c.releaseLocked()
	c.shadow = shadow
	c.mu.Unlock()
}

// start finishes setup: it drops or watches the shadow connection.
func (c *Conn) start() {
	d := c.dev
	d.ctr.connsEXTDS.Add(1)
	_ = c.shadow.SetDeadline(time.Time{})
	if !d.cfg.keepShadow {
		c.shadow.Close()
		return
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		c.shadow.Close()
		return
	}
	d.wg.Add(1)
	d.mu.Unlock()
	go c.watchShadow()
}

// watchShadow reads the shadow connection until it ends; an end before the
// peer's SHUTDOWN starts the shadow grace period (see Conn.tick).
func (c *Conn) watchShadow() {
	defer c.dev.wg.Done()
	var b [64]byte
	for {
		if _, err := c.shadow.Read(b[:]); err != nil {
			break
		}
	}
	c.mu.Lock()
	if !c.closed && !c.released {
		c.shadowLost = time.Now()
		c.dev.ctr.shadowLost.Add(1)
	}
	c.mu.Unlock()
}

var errPeerNoFab = errors.New("peer cannot attach to the fabric")

func (c *Conn) clientHandshake(ctx context.Context, raw net.Conn, node fabric.NodeID) (wire.Hello, error) {
	stop := handshakeDeadline(ctx, raw, c.cfg.handshakeTO)
	defer stop()
	lh := c.localHello()
	h, err := askHello(raw, &lh)
	if err != nil {
		return h, err
	}
	if h.Status != wire.StatusOK {
		return h, fmt.Errorf("reply status %d to an ordinary hello: %w", h.Status, wire.ErrHandshake)
	}
	if err := checkNode(&h, node); err != nil {
		return h, err
	}
	if err := c.establish(h); err != nil {
		return h, err
	}
	return h, ackReply(ctx, raw, h.Conn, stop)
}

// askHello sends out as the client's hello on raw and reads the server's
// reply. A server that cannot attach to the fabric answers errPeerNoFab;
// the other statuses are the caller's to judge.
func askHello(raw net.Conn, out *wire.Hello) (wire.Hello, error) {
	var b [wire.HelloLen]byte
	out.Encode(b[:], wire.MagicHello)
	if _, err := raw.Write(b[:]); err != nil {
		return wire.Hello{}, err
	}
	if _, err := io.ReadFull(raw, b[:]); err != nil {
		return wire.Hello{}, err
	}
	h, err := wire.DecodeHello(b[:], wire.MagicReply)
	if err == nil && h.Status == wire.StatusNoFab {
		err = errPeerNoFab
	}
	return h, err
}

// checkNode refuses a reply from a node other than node, the one the
// resolver placed the peer on.
func checkNode(h *wire.Hello, node fabric.NodeID) error {
	if h.Node != node {
		return fmt.Errorf("peer claims node %d, resolver says %d: %w", h.Node, node, wire.ErrHandshake)
	}
	return nil
}

// ackReply acks the server's reply for connection conn and ends the
// handshake's deadline watcher (stop, from handshakeDeadline): ctx's
// error if it ended meanwhile, as the watcher has set (or is setting) a
// past deadline.
func ackReply(ctx context.Context, raw net.Conn, conn uint32, stop func() bool) error {
	var a [wire.AckLen]byte
	wire.EncodeAck(a[:], conn)
	if _, err := raw.Write(a[:]); err != nil {
		return err
	}
	if !stop() && ctx.Err() != nil {
		return ctx.Err()
	}
	return nil
}

// handshakeDeadline bounds raw's I/O by timeout and ctx; stop reports
// (as context.AfterFunc's stop) whether ctx had not yet ended.
func handshakeDeadline(ctx context.Context, raw net.Conn, timeout time.Duration) (stop func() bool) {
	dl := time.Now().Add(timeout)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	_ = raw.SetDeadline(dl)
	return context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
}

// serverHandshake returns the accepted connection, or nil when the socket
// failed (closed, bad handshake from an EXT-DS client).
func (l *Listener) serverHandshake(raw net.Conn) *Conn {
	d := l.dev
	if d == nil {
		return tcpConn(raw, nil)
	}
	cfg := &d.cfg
	_ = raw.SetReadDeadline(time.Now().Add(cfg.peekTO))
	var b [wire.HelloLen]byte
	n, err := io.ReadFull(raw, b[:HelloPrefixLen])
	if err != nil || string(b[:HelloPrefixLen]) != wire.MagicHello {
		var ne net.Error
		if err != nil && !(errors.As(err, &ne) && ne.Timeout()) && n == 0 {
			raw.Close() // closed before saying anything
			return nil
		}
		_ = raw.SetReadDeadline(time.Time{})
		return d.fallback(raw, &replayConn{Conn: raw, pre: append([]byte(nil), b[:n]...)}, FallbackPlainPeer)
	}
	_ = raw.SetDeadline(time.Now().Add(cfg.handshakeTO))
	if _, err := io.ReadFull(raw, b[HelloPrefixLen:]); err != nil {
		d.ctr.handshakeErr.Add(1)
		raw.Close()
		return nil
	}
	c, _, err := d.serverHello(raw, l.port, &b, nil)
	if err != nil {
		raw.Close()
		return nil
	}
	if c.fb == nil {
		c.start()
	}
	return c
}

// HelloPrefixLen is how many first bytes of a stream tell an EXT-DS
// client's hello from anything else.
const HelloPrefixLen = len(wire.MagicHello)

// ClassifyPeek looks at the first bytes a server received (peeked, not
// consumed): hello means they start an EXT-DS hello, plain that they
// cannot; neither means they are a strict prefix of the hello magic and
// more bytes are needed to tell.
func ClassifyPeek(b []byte) (hello, plain bool) {
	n := min(len(b), HelloPrefixLen)
	if string(b[:n]) != wire.MagicHello[:n] {
		return false, true
	}
	return n == HelloPrefixLen, false
}

// AcceptShadow is the server side of Upgrade: shadow is a TCP socket an
// application accepted itself, and peeked holds its first bytes, peeked
// and not consumed (MSG_PEEK), with at least HelloPrefixLen bytes unless
// the client sent fewer before a timeout or EOF.
//
//   - peeked is not an EXT-DS hello (ClassifyPeek): a *Conn in ModeTCP
//     wrapping shadow; nothing is read from or written to it, so the
//     application reads the client's bytes itself (FallbackPlainPeer).
//   - peeked is a hello: the hello is consumed and the server handshake
//     runs (HandshakeTimeout, and ctx). The result is a *Conn in
//     ModeEXTDS that owns shadow, or in ModeTCP (FallbackPeerNoFab) when
//     this node cannot attach the connection and told the client so.
//   - Error: a bad hello, a timeout or ctx ending mid-handshake. The
//     stream is unusable, so AcceptShadow shuts shadow down in both
//     directions; the caller still closes it.
func (d *Device) AcceptShadow(ctx context.Context, shadow net.Conn, peeked []byte) (*Conn, error) {
	c, _, err := d.acceptShadow(ctx, shadow, peeked, nil)
	return c, err
}

func (d *Device) acceptShadow(ctx context.Context, shadow net.Conn, peeked []byte, create func() (DirectInfo, error)) (*Conn, *DirectInfo, error) {
	if hello, _ := ClassifyPeek(peeked); !hello {
		return d.fallback(shadow, nil, FallbackPlainPeer), nil, nil
	}
	fail := func(err error) (*Conn, *DirectInfo, error) {
		abandon(shadow)
		return nil, nil, &net.OpError{Op: "accept", Net: "extds", Source: shadow.LocalAddr(), Addr: shadow.RemoteAddr(), Err: err}
	}
	port, ok := portOf(shadow.LocalAddr())
	if !ok {
		return fail(fmt.Errorf("local address %v has no port", shadow.LocalAddr()))
	}
	dl := time.Now().Add(d.cfg.handshakeTO)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	_ = shadow.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = shadow.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [wire.HelloLen]byte
	if _, err := io.ReadFull(shadow, b[:]); err != nil {
		d.ctr.handshakeErr.Add(1)
		return fail(err)
	}
	c, di, err := d.serverHello(shadow, port, &b, create)
	if err != nil {
		return fail(err)
	}
	if di != nil {
		if !stop() && ctx.Err() != nil {
			return fail(ctx.Err())
		}
		_ = shadow.SetDeadline(time.Time{})
		return nil, di, nil
	}
	if !stop() && ctx.Err() != nil {
		c.abortAny()
		return fail(ctx.Err())
	}
	if c.fb == nil {
		c.start()
	}
	return c, nil, nil
}

// serverHello finishes the server handshake once the whole hello is in b:
// attach, reply, read the ack. It returns a connection in ModeEXTDS (not
// yet started), in ModeTCP when this node cannot attach (the client was
// told), or an error (raw is then not closed).
func (d *Device) serverHello(raw net.Conn, port uint16, b *[wire.HelloLen]byte, create func() (DirectInfo, error)) (*Conn, *DirectInfo, error) {
	h, err := wire.DecodeHello(b[:], wire.MagicHello)
	if err == nil && h.Status != wire.StatusOK {
		err = fmt.Errorf("hello with status %d: %w", h.Status, wire.ErrHandshake)
	}
	if err != nil {
		d.ctr.handshakeErr.Add(1)
		d.rlog.warn("extds: bad hello", "from", raw.RemoteAddr(), "err", err)
		return nil, nil, err
	}
	if h.Flags&wire.FlagDirect != 0 && h.Ring == 0 {
		// A direct offer: make one, or ask for the ordinary hello.
		var di *DirectInfo
		if h, di, err = d.serverDirect(raw, b, create); di != nil || err != nil {
			return nil, di, err
		}
	}
	c, err := d.newConn(port, raw)
	if err == nil {
		if err = c.establish(h); err != nil {
			c.discard()
		}
	}
	if err != nil {
		d.rlog.warn("extds: cannot attach accepted connection, using tcp", "err", err)
		var r wire.Hello
		r.Status = wire.StatusNoFab
		r.Encode(b[:], wire.MagicReply)
		if _, err := raw.Write(b[:]); err != nil {
			return nil, nil, err
		}
		_ = raw.SetDeadline(time.Time{})
		return d.fallback(raw, nil, FallbackPeerNoFab), nil, nil
	}
	lh := c.localHello()
	lh.Encode(b[:], wire.MagicReply)
	if _, err = raw.Write(b[:]); err == nil {
		var a [wire.AckLen]byte
		if _, err = io.ReadFull(raw, a[:]); err == nil {
			err = wire.DecodeAck(a[:], c.id)
		}
		if err == nil {
			return c, nil, nil
		}
	}
	d.ctr.handshakeErr.Add(1)
	c.discard()
	return nil, nil, err
}
