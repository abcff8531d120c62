package node

// Throughput benchmarks: one TCP flow between two netstack nodes over the
// exn engine on the mem fabric, against baselines measured in the same run
// with the same MTU and TCP settings:
//
//	direct  two gVisor stacks joined by gVisor's pipe link (wrapped in the
//	        same Ethernet link, so ARP runs too): no fabric, no copies
//	        beyond gVisor's own.
//	wire    two exn/netstack endpoints joined without an engine: the
//	        endpoint's own cost (queue, copy, batching) without the fabric.
//
// BenchmarkTCPRatio interleaves fabric and direct transfers in one loop and
// reports their ratio, which is what docs/netstack.md quotes:
//
//	go test -run '^$' -bench 'TCP' -benchtime 20x -count 3 ./exn/node

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/link/pipe"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/exn-project/exn/exn/netstack"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

const (
	benchChunk = 256 << 10 // bytes per Write
	benchXfer  = 32 << 20  // bytes per benchmark iteration
)

var (
	benchA = netip.MustParsePrefix("10.88.0.1/24")
	benchB = netip.MustParsePrefix("10.88.0.2/24")
)

// pairDialer is one side's dial and the other side's listen.
type pairDialer struct {
	dial   func(ctx context.Context) (net.Conn, error)
	listen net.Listener
	close  func()
	// stacks are the sender's and receiver's stacks, for TCP counters.
	stacks [2]*stack.Stack
}

// tcpEvents sums the TCP loss-recovery and stall counters of both stacks.
func (p pairDialer) tcpEvents() (retrans, timeouts, zeroWindow uint64) {
	for _, s := range p.stacks {
		st := s.Stats().TCP
		retrans += st.Retransmits.Value()
		timeouts += st.Timeouts.Value()
		zeroWindow += st.FastRecovery.Value()
	}
	return
}

// transfer sends n bytes over one fresh connection and returns the time
// from the first byte written until the receiver has read the last.
func transfer(tb testing.TB, p pairDialer, n int) time.Duration {
	tb.Helper()
	got := make(chan error, 1)
	var done time.Time
	go func() {
		c, err := p.listen.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		buf := make([]byte, benchChunk)
		m, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, buf)
		done = time.Now()
		if err == nil && m != int64(n) {
			err = io.ErrUnexpectedEOF
		}
		got <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := p.dial(ctx)
	if err != nil {
		tb.Fatalf("dial: %v", err)
	}
	buf := make([]byte, benchChunk)
	start := time.Now()
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf[:min(len(buf), n-sent)]); err != nil {
			tb.Fatalf("write: %v", err)
		}
	}
	c.Close()
	if err := <-got; err != nil {
		tb.Fatalf("receive: %v", err)
	}
	return done.Sub(start)
}

func fabricPair(tb testing.TB, edit func(*Config)) pairDialer {
	tb.Helper()
	c, err := NewCluster(2, WithConfig(func(cfg *Config) {
		cfg.Logger = quietLogger()
		if edit != nil {
			edit(cfg)
		}
	}))
	if err != nil {
		tb.Fatal(err)
	}
	a, b := c.Node(0), c.Node(1)
	l := listen(tb, b, "tcp", ":5001")
	return pairDialer{
		dial:   func(ctx context.Context) (net.Conn, error) { return a.DialContext(ctx, "tcp", "10.88.0.2:5001") },
		listen: l,
		close:  func() { c.Close() },
		stacks: [2]*stack.Stack{a.Stack(), b.Stack()},
	}
}

// stackPair joins two stacks, built as a Node builds its own, by the given
// pair of inner (header-less) link endpoints, each wrapped in Ethernet.
func stackPair(tb testing.TB, la, lb stack.LinkEndpoint) pairDialer {
	tb.Helper()
	t, err := TCPConfig{}.withDefaults()
	if err != nil {
		tb.Fatal(err)
	}
	// side is a stack with link attached as the NIC of address addr.
	side := func(link stack.LinkEndpoint, addr netip.Prefix) *stack.Stack {
		s, err := newStack(t)
		if err != nil {
			tb.Fatal(err)
		}
		if err := attach(s, ethernet.New(link), addr); err != nil {
			tb.Fatal(err)
		}
		return s
	}
	sa, sb := side(la, benchA), side(lb, benchB)
	l, err := gonet.ListenTCP(sb, tcpip.FullAddress{NIC: nicID, Port: 5001}, ipv4.ProtocolNumber)
	if err != nil {
		tb.Fatal(err)
	}
	dst := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(benchB.Addr().AsSlice()), Port: 5001}
	return pairDialer{
		dial: func(ctx context.Context) (net.Conn, error) {
			return gonet.DialContextTCP(ctx, sa, dst, ipv4.ProtocolNumber)
		},
		listen: l,
		close: func() {
			l.Close()
			sa.Destroy()
			sb.Destroy()
		},
		stacks: [2]*stack.Stack{sa, sb},
	}
}

func directPair(tb testing.TB) pairDialer {
	pa, pb := pipe.New(
		tcpip.LinkAddress(fabric.DefaultMACPrefix.MAC(1)),
		tcpip.LinkAddress(fabric.DefaultMACPrefix.MAC(2)),
		netstack.DefaultMTU+14)
	return stackPair(tb, pa, pb)
}

// channelPair joins two stacks by gVisor channel endpoints, with one pump
// goroutine per direction moving each packet (its bytes shared, not
// copied) from one endpoint's queue into the other's stack: the usual
// gVisor test topology, asynchronous like the fabric.
//
// With copy set, the pump copies each packet into fresh gVisor buffers
// (view by view, so the headers stay apart from the payload, as
// netstack.Endpoint delivers them), as a NIC delivers into its own rx
// buffers; receive-window accounting then sees right-sized buffers
// instead of the sender's chunks. (Copying a 64 KiB packet into a single
// chunk would make the receiving IP layer copy it again: see frameBuffer
// in exn/netstack.)
func channelPair(tb testing.TB, copy bool) pairDialer {
	tb.Helper()
	ca := channel.New(1024, netstack.DefaultMTU+14, tcpip.LinkAddress(fabric.DefaultMACPrefix.MAC(1)))
	cb := channel.New(1024, netstack.DefaultMTU+14, tcpip.LinkAddress(fabric.DefaultMACPrefix.MAC(2)))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	pump := func(from, to *channel.Endpoint) {
		defer wg.Done()
		for {
			pkt := from.ReadContext(ctx)
			if pkt == nil {
				return
			}
			var payload buffer.Buffer
			if copy {
				b := pkt.ToBuffer()
				payload = b.DeepClone()
				b.Release()
			} else {
				payload = pkt.ToBuffer()
			}
			in := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payload})
			pkt.DecRef()
			to.InjectInbound(0, in)
			in.DecRef()
		}
	}
	wg.Add(2)
	go pump(ca, cb)
	go pump(cb, ca)
	p := stackPair(tb, ca, cb)
	inner := p.close
	p.close = func() {
		cancel()
		wg.Wait()
		inner()
	}
	return p
}

// wireTx hands frames straight to a peer endpoint.
type wireTx struct{ peer *netstack.Endpoint }

func (w wireTx) Transmit(_ context.Context, frames [][]byte) (int, error) {
	if err := w.peer.DeliverFrames(frames); err != nil {
		return 0, err
	}
	return len(frames), nil
}

func wirePair(tb testing.TB) pairDialer {
	tb.Helper()
	ea, err := netstack.New(netstack.Config{MAC: fabric.DefaultMACPrefix.MAC(1), Logger: quietLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	eb, err := netstack.New(netstack.Config{MAC: fabric.DefaultMACPrefix.MAC(2), Logger: quietLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	ea.Start(wireTx{eb})
	eb.Start(wireTx{ea})
	return stackPair(tb, ea, eb)
}

func benchPair(b *testing.B, p pairDialer) {
	defer p.close()
	transfer(b, p, 1<<20) // warm up: ARP, buffers
	b.SetBytes(benchXfer)
	b.ReportAllocs()
	b.ResetTimer()
	var total time.Duration
	for range b.N {
		total += transfer(b, p, benchXfer)
	}
	b.ReportMetric(float64(benchXfer)*float64(b.N)/total.Seconds()/1e6, "MB/s-flow")
	r, to, zw := p.tcpEvents()
	b.ReportMetric(float64(r), "retrans")
	b.ReportMetric(float64(to), "rto")
	b.ReportMetric(float64(zw), "fastrecov")
}

// BenchmarkTCP measures one flow per variant; compare them by MB/s.
func BenchmarkTCP(b *testing.B) {
	b.Run("fabric", func(b *testing.B) { benchPair(b, fabricPair(b, nil)) })
	b.Run("fabric-csum-offload", func(b *testing.B) {
		benchPair(b, fabricPair(b, func(c *Config) { c.Link.ChecksumOffload = true }))
	})
	b.Run("wire", func(b *testing.B) { benchPair(b, wirePair(b)) })
	b.Run("direct-pipe", func(b *testing.B) { benchPair(b, directPair(b)) })
	b.Run("direct-channel", func(b *testing.B) { benchPair(b, channelPair(b, false)) })
	b.Run("direct-channel-copy", func(b *testing.B) { benchPair(b, channelPair(b, true)) })
}

// BenchmarkTCPRatio alternates a fabric transfer with transfers over two
// direct baselines per iteration, so all see the same machine load, and
// reports the median throughput of each and the ratios:
//
//	ratio-channel       fabric / direct-channel-copy: two stacks joined by
//	                    gVisor's channel endpoint, the pump delivering each
//	                    packet in a buffer of its own, as a NIC does (the
//	                    issue's baseline);
//	ratio-zerocopy      fabric / direct-channel: the same link passing the
//	                    sender's buffers through untouched (zero copies, the
//	                    strictest baseline).
//
// Medians, because one retransmission timeout (200 ms minimum RTO in
// gVisor) in a 10 ms transfer would otherwise dominate a mean; the rto
// metrics count them.
func BenchmarkTCPRatio(b *testing.B) {
	fab, zc, cp := fabricPair(b, nil), channelPair(b, false), channelPair(b, true)
	defer fab.close()
	defer zc.close()
	defer cp.close()
	for _, p := range []pairDialer{fab, zc, cp} {
		transfer(b, p, 1<<20)
	}
	b.SetBytes(3 * benchXfer)
	b.ReportAllocs()
	b.ResetTimer()
	tf := make([]float64, 0, b.N)
	tz := make([]float64, 0, b.N)
	tc := make([]float64, 0, b.N)
	for range b.N {
		tf = append(tf, float64(benchXfer)/transfer(b, fab, benchXfer).Seconds()/1e6)
		tz = append(tz, float64(benchXfer)/transfer(b, zc, benchXfer).Seconds()/1e6)
		tc = append(tc, float64(benchXfer)/transfer(b, cp, benchXfer).Seconds()/1e6)
	}
	mf, mz, mc := testenv.Median(tf), testenv.Median(tz), testenv.Median(tc)
	b.ReportMetric(mf, "fabric-MB/s")
	b.ReportMetric(mc, "channel-MB/s")
	b.ReportMetric(mz, "zerocopy-MB/s")
	b.ReportMetric(mf/mc, "ratio-channel")
	b.ReportMetric(mf/mz, "ratio-zerocopy")
	for _, m := range []struct {
		name string
		p    pairDialer
	}{{"fabric", fab}, {"channel", cp}, {"zerocopy", zc}} {
		r, to, _ := m.p.tcpEvents()
		b.ReportMetric(float64(r), m.name+"-retrans")
		b.ReportMetric(float64(to), m.name+"-rto")
	}
}
