package members

// Transport is memberlist.Transport over one UDP socket and TCP streams,
// the one the fabric's backends share (fabric/fabnet on its own fabric
// address, fabric/ofi beside the provider's). Every datagram and stream
// is checked against the peers' IPs first: the peers table and the
// underlay are the trust boundary, as for the fabric's own sessions.
//
//	datagrams: readLoop ──► source IP check ──► Intercept (the backend's
//	   own datagrams, if it claims them) ──► packets chan ──► memberlist
//	memberlist WriteTo ──► sendto
//	streams: DialTimeout writes StreamMagic first; incoming ones either
//	   come through the Transport's own listener (acceptLoop: the magic
//	   read with a deadline, at most maxAccepts at once) or are handed in
//	   with Accept by a backend that read the magic on its own port
//
// Datagrams are read and sent by raw recvfrom and sendto on the
// non-blocking socket, parked in the netpoller between them
// (internal/sys/rawdgram_linux.go says why: an idle node's datagram
// then wakes no second thread).
//
// Goroutines: readLoop, and acceptLoop with its per-stream checks when
// the Transport has a listener, are started by Start and owned by the
// Transport: Shutdown (memberlist calls it when Members closes) stops and
// waits for them. Locks: none; the channels are the interface to
// memberlist and the counters are atomic.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
	"golang.org/x/sys/unix"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/ratelog"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// transportQueue bounds received packets memberlist has not taken yet;
	// past it they are dropped (UDP would drop them too) and counted.
	transportQueue = 1024
	// packetMax is the largest datagram read (memberlist sends at most
	// its UDPBufferSize, 1400 bytes).
	packetMax = 64 << 10
	// streamQueue bounds accepted streams memberlist has not taken yet.
	streamQueue = 32
	// maxAccepts bounds streams whose magic is still being read, so a
	// flood of silent connections costs bounded goroutines and fds.
	maxAccepts = 32
	// magicTimeout bounds the wait for a stream's magic.
	magicTimeout = 2 * time.Second
	// faultInterval is how often a kind of refused input is logged.
	faultInterval = time.Second
)

// TransportConfig configures a Transport.
type TransportConfig struct {
	// UDP is the bound datagram socket (required); the Transport owns it.
	UDP *net.UDPConn
	// Listener, if set, is where streams arrive; the Transport owns it.
	// Nil: the owner reads StreamMagic on its own port and hands the
	// stream in with Accept.
	Listener net.Listener
	// Advertise is the address the other nodes reach this one at, for
	// datagrams and streams alike (required).
	Advertise netip.AddrPort
	// Peers are the peers' addresses (host:port). Datagrams and streams
	// from any other IP are refused; an entry that is a host name turns
	// the check off (its address would need a lookup).
	Peers []string
	// StreamMagic, 4 bytes, opens every stream.
	StreamMagic string
	// Intercept, if set, is offered each datagram from a peer's IP before
	// memberlist; true means it took it. It runs on the reader goroutine,
	// must not block, and must not keep b.
	Intercept func(b []byte, from netip.AddrPort) bool
	// Logger receives refused input, at most once a second per kind;
	// nil discards.
	Logger *slog.Logger
}

// TransportStats counts a Transport's traffic.
type TransportStats struct {
	// In and Out: datagrams given to and sent for memberlist.
	In, Out uint64
	// Streams: streams opened either way.
	Streams uint64
	// Foreign: datagrams and streams refused for coming from an address
	// outside the peers (and streams without the magic).
	Foreign uint64
	// Dropped: datagrams and streams dropped because memberlist had not
	// taken the earlier ones yet, or too many streams were being read.
	Dropped uint64
}

// Transport is memberlist.Transport (see the file comment). Its methods
// are safe for concurrent use.
type Transport struct {
	cfg     TransportConfig
	rc      syscall.RawConn     // cfg.UDP's: raw datagram calls (readLoop, send)
	v6      bool                // cfg.UDP is an AF_INET6 socket
	allowed map[netip.Addr]bool // nil: nothing checked
	packets chan *memberlist.Packet
	streams chan net.Conn
	faults  ratelog.Faults
	sem     chan struct{}

	in, out, nstreams, foreign, dropped atomic.Uint64

	wg   sync.WaitGroup
	once sync.Once
	life context.Context // cancelled by Shutdown
	stop context.CancelFunc
}

// NewTransport checks cfg and makes the Transport; Start starts it.
func NewTransport(cfg TransportConfig) (*Transport, error) {
	if cfg.UDP == nil || !cfg.Advertise.IsValid() || len(cfg.StreamMagic) != 4 {
		return nil, fmt.Errorf("members: transport needs a socket, an address and a 4-byte magic: %w", fabric.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{
		cfg: cfg, allowed: PeerIPs(cfg.Peers),
		packets: make(chan *memberlist.Packet, transportQueue),
		streams: make(chan net.Conn, streamQueue),
		sem:     make(chan struct{}, maxAccepts),
	}
	t.life, t.stop = context.WithCancel(context.Background())
	t.faults.Init(cfg.Logger, faultInterval)
	rc, err := cfg.UDP.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("members: transport socket: %w", err)
	}
	t.rc = rc
	rc.Control(func(fd uintptr) { t.v6 = sys.SockIs6(int(fd)) })
	return t, nil
}

// Start starts the reader (and the acceptor, with a Listener). Call it
// once, after whatever Intercept uses is ready.
func (t *Transport) Start() {
	t.wg.Add(1)
	go t.readLoop()
	if t.cfg.Listener != nil {
		t.wg.Add(1)
		go t.acceptLoop()
	}
}

// PeerIPs is the set of the addresses' IP literals, or nil when one is a
// host name.
func PeerIPs(addrs []string) map[netip.Addr]bool {
	m := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return nil
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return nil
		}
		m[ip.Unmap()] = true
	}
	return m
}

// FromPeer says whether a datagram or stream from ip may be a peer's.
func (t *Transport) FromPeer(ip netip.Addr) bool {
	return t.allowed == nil || t.allowed[ip.Unmap()]
}

// Stats returns the counters.
func (t *Transport) Stats() TransportStats {
	return TransportStats{In: t.in.Load(), Out: t.out.Load(), Streams: t.nstreams.Load(),
		Foreign: t.foreign.Load(), Dropped: t.dropped.Load()}
}

// LocalAddr is the UDP socket's address.
func (t *Transport) LocalAddr() net.Addr { return t.cfg.UDP.LocalAddr() }

// WriteToAddrPort sends a backend's own datagram from the membership
// socket (not counted as memberlist's).
func (t *Transport) WriteToAddrPort(b []byte, to netip.AddrPort) error { return t.send(b, to) }

// send sends one datagram by a raw sendto (internal/sys/rawdgram_linux.go:
// no scheduler bookkeeping, so an idle node's send wakes no second
// thread), waiting in the netpoller while the socket buffer is full.
func (t *Transport) send(b []byte, to netip.AddrPort) error {
	var serr error
	err := t.rc.Write(func(fd uintptr) bool {
		serr = sys.SendtoRaw(int(fd), t.v6, b, to)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return &net.OpError{Op: "write", Net: "udp", Addr: net.UDPAddrFromAddrPort(to), Err: os.NewSyscallError("sendto", serr)}
	}
	return nil
}

// recv reads one datagram into b by a raw recvfrom, parked in the
// netpoller while none is queued.
func (t *Transport) recv(b []byte) (int, netip.AddrPort, error) {
	var k int
	var from netip.AddrPort
	var rerr error
	err := t.rc.Read(func(fd uintptr) bool {
		k, from, rerr = sys.RecvfromRaw(int(fd), b)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return 0, from, err
	}
	if rerr != nil {
		return 0, from, os.NewSyscallError("recvfrom", rerr)
	}
	return k, from, nil
}

func (t *Transport) readLoop() {
	defer t.wg.Done()
	buf := make([]byte, packetMax)
	for {
		k, from, err := t.recv(buf)
		if err != nil {
			if t.life.Err() != nil || errors.Is(err, net.ErrClosed) {
				return // Shutdown
			}
			t.faults.Warn("members: datagram read", "err", err)
			continue
		}
		now := time.Now()
		if !t.FromPeer(from.Addr()) {
			t.foreign.Add(1)
			t.faults.Warn("members: datagram from outside the peers refused", "remote", from.String())
			continue
		}
		if t.cfg.Intercept != nil && t.cfg.Intercept(buf[:k], from) {
			continue
		}
		t.in.Add(1)
		p := &memberlist.Packet{Buf: slices.Clone(buf[:k]), From: net.UDPAddrFromAddrPort(from), Timestamp: now}
		select {
		case t.packets <- p:
		default:
			t.dropped.Add(1)
		}
	}
}

func (t *Transport) acceptLoop() {
	defer t.wg.Done()
	for {
		c, err := t.cfg.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.faults.Warn("members: accept", "err", err)
			select {
			case <-time.After(20 * time.Millisecond):
			case <-t.life.Done():
				return
			}
			continue
		}
		select {
		case t.sem <- struct{}{}:
		default:
			t.dropped.Add(1)
			c.Close()
			continue
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer func() { <-t.sem }()
			// Shutdown ends the magic's read at once.
			defer context.AfterFunc(t.life, func() { c.SetDeadline(time.Unix(1, 0)) })()
			c.SetReadDeadline(time.Now().Add(magicTimeout))
			var b [4]byte
			if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != t.cfg.StreamMagic {
				t.foreign.Add(1)
				t.faults.Warn("members: stream without the magic refused", "remote", c.RemoteAddr().String())
				c.Close()
				return
			}
			c.SetReadDeadline(time.Time{})
			t.Accept(c)
		}()
	}
}

// Accept takes a stream whose first bytes were StreamMagic (read by the
// caller or by acceptLoop): from a peer's IP it goes to memberlist, else
// it is closed and counted.
func (t *Transport) Accept(c net.Conn) {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok && !t.FromPeer(ip) {
			t.foreign.Add(1)
			t.faults.Warn("members: stream from outside the peers refused", "remote", ta.String())
			c.Close()
			return
		}
	}
	select {
	case t.streams <- c:
		t.nstreams.Add(1)
	default:
		t.dropped.Add(1)
		c.Close()
	}
}

func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return net.IP(t.cfg.Advertise.Addr().AsSlice()), int(t.cfg.Advertise.Port()), nil
}

func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return time.Time{}, fmt.Errorf("members: address %q: %w", addr, err)
	}
	t.out.Add(1)
	err = t.send(b, ap)
	return time.Now(), err
}

func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(t.cfg.StreamMagic)); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	t.nstreams.Add(1)
	return c, nil
}

func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown closes the socket and the listener, waits for the
// Transport's goroutines and closes every stream not taken yet.
// Idempotent.
func (t *Transport) Shutdown() error {
	var err error
	t.once.Do(func() {
		t.stop()
		err = t.cfg.UDP.Close()
		if t.cfg.Listener != nil {
			t.cfg.Listener.Close()
		}
		t.wg.Wait()
		for {
			select {
			case c := <-t.streams:
				c.Close()
			default:
				return
			}
		}
	})
	return err
}
