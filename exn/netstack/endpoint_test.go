package netstack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/exn-project/exn/internal/testenv"
)

// wire is a Transmitter that hands frames straight to a peer endpoint's
// DeliverFrames: a fabric-less link, so these tests isolate the endpoint.
type wire struct {
	peer *Endpoint
	drop atomic.Bool
}

func (w *wire) Transmit(ctx context.Context, frames [][]byte) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if w.drop.Load() {
		return len(frames), nil
	}
	if err := w.peer.DeliverFrames(frames); err != nil {
		return 0, err
	}
	return len(frames), nil
}

var (
	macA = net.HardwareAddr{0x2e, 0x87, 0x04, 0x07, 0, 1}
	macB = net.HardwareAddr{0x2e, 0x87, 0x04, 0x07, 0, 2}
	ipA  = tcpip.AddrFrom4([4]byte{10, 88, 0, 1})
	ipB  = tcpip.AddrFrom4([4]byte{10, 88, 0, 2})
)

type host struct {
	ep *Endpoint
	s  *stack.Stack
}

func newHost(t testing.TB, ep *Endpoint, ip tcpip.Address) *host {
	t.Helper()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := s.CreateNIC(1, ethernet.New(ep)); err != nil {
		t.Fatalf("create nic: %s", err)
	}
	pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddressWithPrefix{Address: ip, PrefixLen: 24}}
	if err := s.AddProtocolAddress(1, pa, stack.AddressProperties{}); err != nil {
		t.Fatalf("add address: %s", err)
	}
	s.SetRouteTable([]tcpip.Route{{Destination: pa.AddressWithPrefix.Subnet(), NIC: 1}})
	t.Cleanup(func() { s.Destroy() })
	return &host{ep: ep, s: s}
}

// newEndpoint makes an Endpoint of cfg, failing t if New does; it is
// closed when t ends (Close is idempotent).
func newEndpoint(t testing.TB, cfg Config) *Endpoint {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// newPair joins two stacks by two endpoints and a wire each way.
func newPair(t testing.TB, cfg Config) (a, b *host, wa, wb *wire) {
	t.Helper()
	ca, cb := cfg, cfg
	ca.MAC, cb.MAC = macA, macB
	ea := newEndpoint(t, ca)
	eb := newEndpoint(t, cb)
	wa, wb = &wire{peer: eb}, &wire{peer: ea}
	if err := ea.Start(wa); err != nil {
		t.Fatal(err)
	}
	if err := eb.Start(wb); err != nil {
		t.Fatal(err)
	}
	return newHost(t, ea, ipA), newHost(t, eb, ipB), wa, wb
}

func TestNewConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no mac", Config{}, "want 6 octets"},
		{"multicast mac", Config{MAC: net.HardwareAddr{1, 0, 0x5e, 0, 0, 1}}, "multicast"},
		{"mtu too large", Config{MAC: macA, MTU: MaxMTU + 1}, "mtu 65522 not in"},
		{"mtu too small", Config{MAC: macA, MTU: 100}, "mtu 100 not in"},
		{"negative queue", Config{MAC: macA, TxQueueLen: -1}, "negative"},
		{"ok", Config{MAC: macA}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.cfg)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if e.MTU() != DefaultMTU+header.EthernetMinimumSize {
					t.Errorf("MTU() = %d, want %d", e.MTU(), DefaultMTU+header.EthernetMinimumSize)
				}
				e.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: err %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestStartErrors(t *testing.T) {
	e := newEndpoint(t, Config{MAC: macA})
	if err := e.Start(nil); err == nil {
		t.Error("Start(nil): no error")
	}
	if err := e.Start(&wire{peer: e}); err != nil {
		t.Fatal(err)
	}
	if err := e.Start(&wire{peer: e}); err == nil {
		t.Error("second Start: no error")
	}
	e.Close()
	e.Close() // idempotent
}

func TestTCPEchoAndSHA(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	a, b, _, _ := newPair(t, Config{})
	size := 32 << 20
	if testenv.Small() {
		size = 4 << 20
	}
	l, err := gonet.ListenTCP(b.s, tcpip.FullAddress{NIC: 1, Addr: ipB, Port: 7}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		_, err = io.Copy(c, c) // echo until the client closes its write side
		srvErr <- err
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := gonet.DialContextTCP(ctx, a.s, tcpip.FullAddress{NIC: 1, Addr: ipB, Port: 7}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))

	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i*7 + i>>10)
	}
	want := sha256.Sum256(src)
	go func() {
		c.Write(src)
		c.CloseWrite()
	}()
	h := sha256.New()
	got, err := io.Copy(h, c)
	if err != nil {
		t.Fatalf("read echo: %v after %d bytes", err, got)
	}
	if got != int64(size) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("echo: %d bytes, sha mismatch=%v; want %d", got, !bytes.Equal(h.Sum(nil), want[:]), size)
	}
	if err := <-srvErr; err != nil {
		t.Fatalf("server: %v", err)
	}
	// ARP ran in netstack: A learned B's MAC from B's reply.
	ns, terr := a.s.Neighbors(1, ipv4.ProtocolNumber)
	if terr != nil {
		t.Fatalf("neighbors: %s", terr)
	}
	found := false
	for _, n := range ns {
		if n.Addr == ipB && n.LinkAddr == tcpip.LinkAddress(macB) {
			found = true
		}
	}
	if !found {
		t.Errorf("A's neighbour table %v lacks %v -> %v", ns, ipB, macB)
	}
	sa := a.ep.Stats()
	if sa.TxFrames == 0 || sa.RxFrames == 0 || sa.TxBytes < uint64(size) {
		t.Errorf("stats %+v: want frames both ways and >= %d tx bytes", sa, size)
	}
}

// blocker is a Transmitter that blocks until released or cancelled.
type blocker struct {
	entered chan struct{}
	once    sync.Once
	release chan struct{}
}

func (b *blocker) Transmit(ctx context.Context, frames [][]byte) (int, error) {
	b.once.Do(func() { close(b.entered) })
	select {
	case <-b.release:
		return len(frames), nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func udpPacket(t testing.TB, payload int) *stack.PacketBuffer {
	t.Helper()
	return stack.NewPacketBuffer(stack.PacketBufferOptions{
		Payload: buffer.MakeWithData(make([]byte, header.EthernetMinimumSize+payload)),
	})
}

// TestWritePacketsNeverBlocks: with Transmit stuck (back-pressure), writes
// fill the queue and then drop, counted, without blocking; Close cancels
// the stuck Transmit and returns.
func TestWritePacketsNeverBlocks(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	e := newEndpoint(t, Config{MAC: macA, TxQueueLen: 8})
	bl := &blocker{entered: make(chan struct{}), release: make(chan struct{})}
	if err := e.Start(bl); err != nil {
		t.Fatal(err)
	}
	write := func(n int) (int, tcpip.Error) {
		var l stack.PacketBufferList
		for range n {
			l.PushBack(udpPacket(t, 100))
		}
		defer l.DecRef()
		return e.WritePackets(l)
	}
	if n, err := write(1); n != 1 || err != nil {
		t.Fatalf("first write: %d, %v", n, err)
	}
	<-bl.entered // the tx goroutine holds that frame in Transmit
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := write(20)
		if n != 8 || err != nil {
			t.Errorf("write 20 into a queue of 8: got %d, %v; want 8, nil", n, err)
		}
		if n, err := write(1); n != 0 || err == nil {
			t.Errorf("write into a full queue: %d, %v; want 0, ErrNoBufferSpace", n, err)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("WritePackets blocked on a full queue")
	}
	if got := e.Stats().TxQueueFull; got != 13 {
		t.Errorf("TxQueueFull = %d, want 13", got)
	}
	closed := make(chan struct{})
	go func() { e.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not cancel a blocked Transmit")
	}
	if n, err := write(1); n != 0 || err == nil {
		t.Errorf("write after Close: %d, %v; want ErrClosedForSend", n, err)
	}
	if err := e.DeliverFrames([][]byte{make([]byte, 60)}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("DeliverFrames after Close: %v, want net.ErrClosed", err)
	}
	if err := e.Flush(context.Background()); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Errorf("Flush after Close: %v", err)
	}
}

// countDispatcher counts what reaches the stack.
type countDispatcher struct{ n atomic.Int64 }

func (d *countDispatcher) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	d.n.Add(1)
}
func (d *countDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

func TestDeliverFramesDrops(t *testing.T) {
	e := newEndpoint(t, Config{MAC: macA, MTU: 1500})
	frames := [][]byte{make([]byte, 60)}
	if err := e.DeliverFrames(frames); err != nil {
		t.Fatal(err)
	}
	if got := e.Stats().RxDropped; got != 1 {
		t.Errorf("unattached: RxDropped = %d, want 1", got)
	}
	var d countDispatcher
	e.Attach(&d)
	if !e.IsAttached() {
		t.Fatal("not attached")
	}
	in := [][]byte{
		make([]byte, 13),   // runt
		make([]byte, 1515), // over MTU+14
		make([]byte, 14),   // bare header: fine
		make([]byte, 1514), // full frame: fine
	}
	if err := e.DeliverFrames(in); err != nil {
		t.Fatal(err)
	}
	if d.n.Load() != 2 {
		t.Errorf("delivered %d, want 2", d.n.Load())
	}
	if got := e.Stats().RxDropped; got != 3 {
		t.Errorf("RxDropped = %d, want 3", got)
	}
}

// TestTransmitErrorSkipsFrame: a frame Transmit rejects is dropped and
// counted, and the rest of its batch still goes out.
func TestTransmitErrorSkipsFrame(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	e := newEndpoint(t, Config{MAC: macA})
	var mu sync.Mutex
	var sent []int
	tx := txFunc(func(ctx context.Context, frames [][]byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		for i, f := range frames {
			if len(f) == header.EthernetMinimumSize+13 {
				return i, errors.New("unknown node")
			}
			sent = append(sent, len(f)-header.EthernetMinimumSize)
		}
		return len(frames), nil
	})
	var l stack.PacketBufferList
	for _, n := range []int{1, 13, 2, 3} {
		l.PushBack(udpPacket(t, n))
	}
	if n, err := e.WritePackets(l); n != 4 || err != nil {
		t.Fatalf("WritePackets: %d, %v", n, err)
	}
	l.DecRef()
	if err := e.Start(tx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []int{1, 2, 3}; len(sent) != 3 || sent[0] != 1 || sent[1] != 2 || sent[2] != 3 {
		t.Errorf("sent payload sizes %v, want %v", sent, want)
	}
	if s := e.Stats(); s.TxErrors != 1 || s.TxFrames != 3 {
		t.Errorf("stats %+v: want TxErrors 1, TxFrames 3", s)
	}
}

type txFunc func(ctx context.Context, frames [][]byte) (int, error)

func (f txFunc) Transmit(ctx context.Context, frames [][]byte) (int, error) { return f(ctx, frames) }

// TestWritePacketsNoAlloc: queuing a frame allocates nothing once the
// buffer pool is warm.
func TestWritePacketsNoAlloc(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("allocation counts are not meaningful under -race or -cover")
	}
	e := newEndpoint(t, Config{MAC: macA})
	if err := e.Start(txFunc(func(ctx context.Context, f [][]byte) (int, error) { return len(f), nil })); err != nil {
		t.Fatal(err)
	}
	pkt := udpPacket(t, 60000)
	defer pkt.DecRef()
	var l stack.PacketBufferList
	l.PushBack(pkt)
	drain := func() {
		for e.pending.Load() > 0 {
			runtime.Gosched()
		}
	}
	for range 10 { // warm the pool
		e.WritePackets(l)
		drain()
	}
	allocs := testing.AllocsPerRun(200, func() {
		e.WritePackets(l)
		drain()
	})
	if allocs > 0.1 {
		t.Errorf("WritePackets of a 60 KB packet: %.2f allocs per frame, want 0", allocs)
	}
}
