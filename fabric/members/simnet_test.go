package members

// simNet is an in-process network for the membership simulation: one
// transport per node, packets through buffered channels (dropped, as UDP
// drops them, when the receiver's queue is full, the receiver is dead, or
// by the configured loss), streams through a socketpair (never lost, as
// TCP, and buffered by the kernel as a socket is: net.Pipe's unbuffered
// writes stalled the full-state exchange of a join past 800 nodes). A
// killed node sends and receives nothing; a paused node's packets, both
// ways, are held until its pause ends (a stalled VM or a long GC).

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"
)

// packetQueue bounds a node's unread packets; past it packets drop.
const packetQueue = 4096

type simNet struct {
	mu    sync.RWMutex
	nodes map[string]*simTransport
	loss  atomic.Uint64 // float64 bits: the probability that a packet is lost
}

func newSimNet() *simNet { return &simNet{nodes: make(map[string]*simTransport)} }

// setLoss makes each packet lost with probability p from now on.
func (n *simNet) setLoss(p float64) { n.loss.Store(math.Float64bits(p)) }

// transport makes node i's transport (address 127.0.0.1:10000+i).
func (n *simNet) transport(i int) *simTransport {
	t := &simTransport{
		net:     n,
		port:    10000 + i,
		packets: make(chan *memberlist.Packet, packetQueue),
		streams: make(chan net.Conn, 16),
	}
	t.addr = "127.0.0.1:" + strconv.Itoa(t.port)
	n.mu.Lock()
	n.nodes[t.addr] = t
	n.mu.Unlock()
	return t
}

func (n *simNet) lookup(addr string) *simTransport {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.nodes[addr]
}

type simTransport struct {
	net     *simNet
	addr    string
	port    int
	packets chan *memberlist.Packet
	streams chan net.Conn

	dead        atomic.Bool
	pausedUntil atomic.Int64 // unix nanoseconds
	sent, recv  atomic.Uint64
	dropped     atomic.Uint64
}

// kill makes the node silent for good (memberlist.Shutdown without a
// leave, and nothing delivered to it any more).
func (t *simTransport) kill() { t.dead.Store(true) }

// pause holds the node's packets, both ways, for d.
func (t *simTransport) pause(d time.Duration) { t.pausedUntil.Store(time.Now().Add(d).UnixNano()) }

func (t *simTransport) heldFor(now time.Time) time.Duration {
	return time.Duration(t.pausedUntil.Load() - now.UnixNano())
}

func (t *simTransport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return net.IPv4(127, 0, 0, 1), t.port, nil
}

func (t *simTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	if t.dead.Load() {
		return now, nil
	}
	t.sent.Add(1)
	dst := t.net.lookup(addr)
	if dst == nil || dst.dead.Load() {
		return now, nil
	}
	if p := math.Float64frombits(t.net.loss.Load()); p > 0 && rand.Float64() < p {
		t.dropped.Add(1)
		return now, nil
	}
	pkt := &memberlist.Packet{Buf: append([]byte(nil), b...), From: simAddr(t.addr), Timestamp: now}
	if hold := max(t.heldFor(now), dst.heldFor(now)); hold > 0 {
		time.AfterFunc(hold, func() { dst.deliver(pkt) })
		return now, nil
	}
	dst.deliver(pkt)
	return now, nil
}

func (t *simTransport) deliver(pkt *memberlist.Packet) {
	if t.dead.Load() {
		return
	}
	pkt.Timestamp = time.Now()
	select {
	case t.packets <- pkt:
		t.recv.Add(1)
	default:
		t.dropped.Add(1)
	}
}

func (t *simTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

var errUnreachable = errors.New("simnet: unreachable")

func (t *simTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	dst := t.net.lookup(addr)
	if t.dead.Load() || dst == nil || dst.dead.Load() {
		return nil, fmt.Errorf("dial %s: %w", addr, errUnreachable)
	}
	if hold := max(t.heldFor(time.Now()), dst.heldFor(time.Now())); hold > 0 {
		time.Sleep(min(hold, timeout))
	}
	t.sent.Add(1)
	a, b, err := streamPair()
	if err != nil {
		return nil, err
	}
	select {
	case dst.streams <- b:
		return a, nil
	case <-time.After(timeout):
		a.Close()
		b.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, errUnreachable)
	}
}

func (t *simTransport) StreamCh() <-chan net.Conn { return t.streams }

func (t *simTransport) Shutdown() error { return nil }

type simAddr string

func (a simAddr) Network() string { return "sim" }
func (a simAddr) String() string  { return string(a) }

// streamPair is a connected pair of stream sockets.
func streamPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	var c [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "simnet-stream")
		c[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				c[0].Close()
			} else {
				syscall.Close(fds[1])
			}
			return nil, nil, fmt.Errorf("socketpair: %w", err)
		}
	}
	return c[0], c[1], nil
}
