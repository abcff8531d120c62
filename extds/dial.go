package extds

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
// connection and remembers the address for a while.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

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

func tcpConn(raw, reader net.Conn) *Conn {
	if reader == nil {
		reader = raw
	}
	return &Conn{mode: ModeTCP, raw: raw, tcp: reader, laddr: raw.LocalAddr(), raddr: raw.RemoteAddr()}
}

// newConn allocates an EXT-DS connection on the vdev of port: ID, rx
// ring, tx mirror, eager buffer.
func (d *Device) newConn(port uint16, shadow net.Conn) (*Conn, error) {
	v, err := d.vdev(int(port & 0xF))
	if err != nil {
		return nil, err
	}
	c := &Conn{
		mode: ModeEXTDS, dev: d, cfg: &d.cfg, vd: v, shadow: shadow,
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
func (c *Conn) establish(h hello) error {
	tx, err := c.vd.ep.Register(int(h.ringSize))
	if err != nil {
		return fmt.Errorf("register tx ring: %w", err)
	}
	c.mu.Lock()
	c.txRing = tx
	c.peerAddr = fabric.Addr{Node: h.node, VPID: h.vpid}
	c.peerID, c.peerRing, c.peerRingSize, c.peerEager = h.conn, h.ring, h.ringSize, h.eagerWin
	c.txFree, c.txEager = h.ringSize, h.eagerWin
	c.mu.Unlock()
	c.dev.mu.Lock()
	c.dev.regions[tx.NLA.Region()] = c
	c.dev.byPeer[peerKey{c.peerAddr, h.conn}] = c
	c.dev.mu.Unlock()
	c.peer.Store(uint32(h.node) | uint32(h.vpid)<<16 | 1<<24)
	return nil
}

func (c *Conn) localHello() hello {
	return hello{
		node: c.dev.att.Node(), vpid: c.vd.ep.Addr().VPID, conn: c.id,
		ring: c.rxRing.NLA, ringSize: c.ringSize, eagerWin: c.eagerWin,
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
	dev := d.Device
	if dev == nil {
		return tcpConn(raw, nil), nil
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
		return dev.fallback(raw, nil, FallbackNoRoute), nil
	}
	if dev.negative(address) {
		return dev.fallback(raw, nil, FallbackCached), nil
	}
	lport, _ := portOf(raw.LocalAddr())
	// Out-of-band agreement keyed by the 4-tuple (claim.go): nothing is
	// written into raw unless the server's acceptor claimed it.
	la, lok := addrPortOf(raw.LocalAddr())
	ra, rok := addrPortOf(raw.RemoteAddr())
	if !lok || !rok {
		return dev.fallback(raw, nil, FallbackNoRoute), nil
	}
	why, agreed, err := dev.offer(ctx, node, la, ra)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		dev.rlog.warn("extds: cannot claim, using tcp", "err", err)
		return dev.fallback(raw, nil, FallbackNoRoute), nil
	}
	if !agreed {
		if why == FallbackNoClaim {
			dev.setNegative(address) // a listener whose acceptor does not claim: TCP for a while
		}
		return dev.fallback(raw, nil, why), nil
	}
	c, err := dev.newConn(lport, raw)
	if err != nil {
		dev.rlog.warn("extds: cannot attach connection, using tcp", "err", err)
		return dev.fallback(raw, nil, FallbackNoRoute), nil
	}
	_, err = c.clientHandshake(ctx, raw, node)
	switch {
	case err == nil:
		c.start()
		return c, nil
	case errors.Is(err, errPeerNoFab):
		c.discard()
		_ = raw.SetDeadline(time.Time{})
		return dev.fallback(raw, nil, FallbackPeerNoFab), nil
	case ctx.Err() != nil:
		c.discard()
		return nil, ctx.Err()
	}
	c.discard()
	dev.ctr.handshakeErr.Add(1)
	dev.rlog.warn("extds: handshake failed", "addr", address, "err", err)
	dev.setNegative(address)
	return nil, fmt.Errorf("%w: %w", errNoAnswer, err)
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

var errPeerNoFab = errors.New("peer cannot attach to the fabric")

func (d *Device) fallback(raw, reader net.Conn, why FallbackReason) *Conn {
	d.ctr.fallbacks[why].Add(1)
	d.ctr.connsTCP.Add(1)
	c := tcpConn(raw, reader)
	c.why, c.fell = why, true
	return c
}

func (c *Conn) clientHandshake(ctx context.Context, raw net.Conn, node fabric.NodeID) (hello, error) {
	dl := time.Now().Add(c.cfg.handshakeTO)
	if t, ok := ctx.Deadline(); ok && t.Before(dl) {
		dl = t
	}
	_ = raw.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var b [helloLen]byte
	lh := c.localHello()
	lh.encode(b[:], magicHello)
	if _, err := raw.Write(b[:]); err != nil {
		return hello{}, err
	}
	if _, err := io.ReadFull(raw, b[:]); err != nil {
		return hello{}, err
	}
	h, err := decodeHello(b[:], magicReply)
	if err != nil {
		return h, err
	}
	if h.status == statusNoFab {
		return h, errPeerNoFab
	}
	if h.node != node {
		return h, fmt.Errorf("peer claims node %d, resolver says %d: %w", h.node, node, errHandshake)
	}
	if err := c.establish(h); err != nil {
		return h, err
	}
	var a [ackLen]byte
	encodeAck(a[:], h.conn)
	if _, err := raw.Write(a[:]); err != nil {
		return h, err
	}
	if !stop() && ctx.Err() != nil {
		return h, ctx.Err() // the watcher has set (or is setting) a past deadline
	}
	return h, nil
}

// Listener accepts EXT-DS connections, and plain TCP clients on the same
// port. It implements net.Listener.
type Listener struct {
	dev   *Device
	inner net.Listener
	port  uint16
	res   Resolver
	unreg func()

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ready  chan *Conn
	errc   chan error

	mu      sync.Mutex
	pending map[net.Conn]struct{}
	closed  bool
}

var _ net.Listener = (*Listener)(nil)

// acceptQueue is the number of handshaken connections waiting for Accept,
// like a listen backlog; beyond it handshakes wait.
const acceptQueue = 128

// Listen listens on a TCP address with dev (nil: plain TCP only).
func Listen(dev *Device, network, address string) (*Listener, error) {
	inner, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return NewListener(dev, inner), nil
}

// NewListener wraps a listener (kernel or netstack) so its connections
// speak EXT-DS. The Listener owns inner and closes it.
func NewListener(dev *Device, inner net.Listener) *Listener {
	l := &Listener{
		dev: dev, inner: inner, ready: make(chan *Conn, acceptQueue), errc: make(chan error, 1),
		pending: make(map[net.Conn]struct{}),
	}
	l.port, _ = portOf(inner.Addr())
	l.unreg = func() {}
	if dev != nil {
		unreg, err := dev.RegisterPort(l.port)
		if err != nil {
			// Clients' probes get no "yes": they stay plain TCP.
			dev.rlog.warn("extds: cannot register listener port", "port", l.port, "err", err)
		}
		l.unreg = unreg
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.acceptLoop()
	return l
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Accept waits for the next connection (EXT-DS or TCP).
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptConn()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptConn is Accept returning the *Conn.
func (l *Listener) AcceptConn() (*Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ctx.Done():
	}
	select {
	case err := <-l.errc:
		return nil, err
	default:
	}
	return nil, &net.OpError{Op: "accept", Net: "extds", Addr: l.inner.Addr(), Err: net.ErrClosed}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		raw, err := l.inner.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && l.ctx.Err() == nil {
				// Transient (e.g. EMFILE reported as temporary): back off.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			if l.ctx.Err() == nil {
				select {
				case l.errc <- err:
				default:
				}
			}
			l.cancel()
			return
		}
		delay = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			raw.Close()
			return
		}
		l.pending[raw] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(raw)
	}
}

// handshake classifies one accepted socket and queues the result.
func (l *Listener) handshake(raw net.Conn) {
	defer l.wg.Done()
	c := l.serverHandshake(raw)
	l.mu.Lock()
	delete(l.pending, raw)
	l.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case l.ready <- c:
	case <-l.ctx.Done():
		c.abortAny()
	}
}

func (c *Conn) abortAny() {
	if c.mode == ModeTCP {
		c.raw.Close()
		return
	}
	c.abort(net.ErrClosed, true)
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
	var b [helloLen]byte
	n, err := io.ReadFull(raw, b[:HelloPrefixLen])
	if err != nil || string(b[:HelloPrefixLen]) != magicHello {
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
	c, err := d.serverHello(raw, l.port, &b)
	if err != nil {
		raw.Close()
		return nil
	}
	if c.mode == ModeEXTDS {
		c.start()
	}
	return c
}

// HelloPrefixLen is how many first bytes of a stream tell an EXT-DS
// client's hello from anything else.
const HelloPrefixLen = len(magicHello)

// ClassifyPeek looks at the first bytes a server received (peeked, not
// consumed): hello means they start an EXT-DS hello, plain that they
// cannot; neither means they are a strict prefix of the hello magic and
// more bytes are needed to tell.
func ClassifyPeek(b []byte) (hello, plain bool) {
	n := min(len(b), HelloPrefixLen)
	if string(b[:n]) != magicHello[:n] {
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
	if hello, _ := ClassifyPeek(peeked); !hello {
		return d.fallback(shadow, nil, FallbackPlainPeer), nil
	}
	fail := func(err error) (*Conn, error) {
		abandon(shadow)
		return nil, &net.OpError{Op: "accept", Net: "extds", Source: shadow.LocalAddr(), Addr: shadow.RemoteAddr(), Err: err}
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
	var b [helloLen]byte
	if _, err := io.ReadFull(shadow, b[:]); err != nil {
		d.ctr.handshakeErr.Add(1)
		return fail(err)
	}
	c, err := d.serverHello(shadow, port, &b)
	if err != nil {
		return fail(err)
	}
	if !stop() && ctx.Err() != nil {
		c.abortAny()
		return fail(ctx.Err())
	}
	if c.mode == ModeEXTDS {
		c.start()
	}
	return c, nil
}

// serverHello finishes the server handshake once the whole hello is in b:
// attach, reply, read the ack. It returns a connection in ModeEXTDS (not
// yet started), in ModeTCP when this node cannot attach (the client was
// told), or an error (raw is then not closed).
func (d *Device) serverHello(raw net.Conn, port uint16, b *[helloLen]byte) (*Conn, error) {
	h, err := decodeHello(b[:], magicHello)
	if err == nil && h.status != statusOK {
		err = fmt.Errorf("hello with status %d: %w", h.status, errHandshake)
	}
	if err != nil {
		d.ctr.handshakeErr.Add(1)
		d.rlog.warn("extds: bad hello", "from", raw.RemoteAddr(), "err", err)
		return nil, err
	}
	c, err := d.newConn(port, raw)
	if err == nil {
		if err = c.establish(h); err != nil {
			c.discard()
		}
	}
	if err != nil {
		d.rlog.warn("extds: cannot attach accepted connection, using tcp", "err", err)
		var r hello
		r.status = statusNoFab
		r.encode(b[:], magicReply)
		if _, err := raw.Write(b[:]); err != nil {
			return nil, err
		}
		_ = raw.SetDeadline(time.Time{})
		return d.fallback(raw, nil, FallbackPeerNoFab), nil
	}
	lh := c.localHello()
	lh.encode(b[:], magicReply)
	if _, err = raw.Write(b[:]); err == nil {
		var a [ackLen]byte
		if _, err = io.ReadFull(raw, a[:]); err == nil {
			err = decodeAck(a[:], c.id)
		}
		if err == nil {
			return c, nil
		}
	}
	d.ctr.handshakeErr.Add(1)
	c.discard()
	return nil, err
}

// Close stops accepting, aborts handshakes in progress and connections not
// yet accepted, and joins the listener's goroutines. Accepted connections
// are not affected.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return &net.OpError{Op: "close", Net: "extds", Addr: l.inner.Addr(), Err: net.ErrClosed}
	}
	l.closed = true
	l.unreg()
	for raw := range l.pending {
		raw.Close()
	}
	l.mu.Unlock()
	l.cancel()
	err := l.inner.Close()
	l.wg.Wait()
	for {
		select {
		case c := <-l.ready:
			c.abortAny()
		default:
			return err
		}
	}
}

// replayConn returns bytes peeked during classification before reading
// the socket again.
type replayConn struct {
	net.Conn
	mu  sync.Mutex
	pre []byte
}

func (r *replayConn) Read(p []byte) (int, error) {
	r.mu.Lock()
	if len(r.pre) > 0 {
		n := copy(p, r.pre)
		r.pre = r.pre[n:]
		r.mu.Unlock()
		return n, nil
	}
	r.mu.Unlock()
	return r.Conn.Read(p)
}
