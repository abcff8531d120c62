package extds

// Listener: accepts shadow connections, runs the server handshake on each
// (handshake.go) and queues the results for Accept, EXT-DS and plain TCP
// clients alike on one port.
//
// Goroutines: acceptLoop and one handshake goroutine per accepted socket,
// owned by the Listener (wg) and joined by Close. Locks: mu guards pending
// (sockets in handshake, closed by Close to end it) and closed; it is
// never held across socket I/O.

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

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
