package arp_test

import (
	"bytes"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/arp"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/peers"
	"github.com/exn-project/exn/internal/testenv"
	"golang.org/x/net/ipv6"
)

var (
	prefix  = fabric.DefaultMACPrefix
	node1   = prefix.MAC(1)
	node2   = prefix.MAC(0x0102)
	foreign = mac("02:00:00:00:00:09")
	ip1     = netip.MustParseAddr("10.9.0.1")
	ip2     = netip.MustParseAddr("10.9.0.2")
	ll1     = netip.MustParseAddr("fe80::1")
	ll2     = netip.MustParseAddr("fe80::2")
	gua2    = netip.MustParseAddr("fd00::2")
	snm     = netip.MustParseAddr("ff02::1:ff00:2")
	allN    = netip.MustParseAddr("ff02::1")
	allR    = netip.MustParseAddr("ff02::2")
	zeroMAC = mac("00:00:00:00:00:00")
)

func newTable(tb testing.TB, opts ...arp.Option) (*arp.Table, *testenv.Clock) {
	tb.Helper()
	clk := testenv.NewClock(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))
	opts = append([]arp.Option{arp.WithClock(clk.Now)}, opts...)
	return arp.New(prefix, slog.New(slog.DiscardHandler), opts...), clk
}

type want struct {
	ip   netip.Addr
	node fabric.NodeID
}

func TestObserve(t *testing.T) {
	tests := []struct {
		name  string
		frame func(tb testing.TB) []byte
		learn []want    // entries expected afterwards
		stats arp.Stats // counters expected (Entries filled from learn)
	}{
		{
			name:  "arp request",
			frame: func(testing.TB) []byte { return whoHas() },
			learn: []want{{ip1, 1}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "arp reply",
			frame: func(testing.TB) []byte { return arpFrame(2, node2, ip2, node1, ip1) },
			learn: []want{{ip2, 0x0102}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name: "arp in 802.1q",
			frame: func(testing.TB) []byte {
				f := whoHas()
				tagged := append([]byte{}, f[:12]...)
				tagged = append(tagged, 0x81, 0x00, 0x00, 0x05)
				return append(tagged, f[12:]...)
			},
			learn: []want{{ip1, 1}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "arp probe teaches nothing",
			frame: func(testing.TB) []byte { return arpFrame(1, node1, netip.IPv4Unspecified(), zeroMAC, ip1) },
			stats: arp.Stats{Observed: 1},
		},
		{
			name:  "arp foreign mac",
			frame: func(testing.TB) []byte { return arpFrame(1, foreign, ip1, zeroMAC, ip2) },
			stats: arp.Stats{Observed: 1, Foreign: 1},
		},
		{
			name:  "arp truncated",
			frame: func(testing.TB) []byte { return whoHas()[:14+20] },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "arp bad opcode",
			frame: func(testing.TB) []byte { return withByte(whoHas(), 14+7, 9) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "arp wrong hlen",
			frame: func(testing.TB) []byte { return withByte(whoHas(), 14+4, 8) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "arp multicast sender ip",
			frame: func(testing.TB) []byte { return arpFrame(1, node1, netip.MustParseAddr("224.0.0.1"), zeroMAC, ip2) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "ns with sll",
			frame: solicit,
			learn: []want{{ll1, 1}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "ns dad teaches nothing",
			frame: ndp(node1, ipv6.ICMPTypeNeighborSolicitation, netip.IPv6Unspecified(), snm, nsBody(ll2)),
			stats: arp.Stats{Observed: 1},
		},
		{
			name:  "na with tll",
			frame: ndp(node1, ipv6.ICMPTypeNeighborAdvertisement, gua2, allN, naBody(gua2, llOpt(2, node2))),
			learn: []want{{gua2, 0x0102}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "na without tll uses ethernet source",
			frame: ndp(node2, ipv6.ICMPTypeNeighborAdvertisement, ll2, ll1, naBody(ll2)),
			learn: []want{{ll2, 0x0102}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "rs with sll",
			frame: ndp(node2, ipv6.ICMPTypeRouterSolicitation, ll2, allR, rsBody(llOpt(1, node2))),
			learn: []want{{ll2, 0x0102}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "ra with sll and other option",
			frame: ndp(node1, ipv6.ICMPTypeRouterAdvertisement, ll1, allN, raBody([]byte{5, 1, 0, 0, 0, 0, 0x05, 0xdc}, llOpt(1, node1))), // MTU 1500 first
			learn: []want{{ll1, 1}},
			stats: arp.Stats{Observed: 1, Learned: 1},
		},
		{
			name:  "ns foreign sll",
			frame: ndp(foreign, ipv6.ICMPTypeNeighborSolicitation, ll1, snm, nsBody(ll2, llOpt(1, foreign))),
			stats: arp.Stats{Observed: 1, Foreign: 1},
		},
		{
			name: "ndp bad checksum",
			frame: func(tb testing.TB) []byte {
				f := solicit(tb)
				f[len(f)-1] ^= 0x40
				return f
			},
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "ndp zero-length option",
			frame: func(tb testing.TB) []byte { return nsFrame(tb, nsBody(ll2, []byte{1, 0, 0, 0, 0, 0, 0, 0})) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "ndp option past end",
			frame: func(tb testing.TB) []byte { return nsFrame(tb, nsBody(ll2, []byte{1, 2, 0, 0, 0, 0, 0, 0})) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "ndp hop limit not 255",
			frame: func(tb testing.TB) []byte { return withByte(solicit(tb), 14+7, 64) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name: "ndp payload length past end",
			frame: func(tb testing.TB) []byte {
				f := solicit(tb)
				return f[:len(f)-4]
			},
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "ns truncated before target",
			frame: func(tb testing.TB) []byte { return nsFrame(tb, []byte{0, 0, 0, 0, 1, 2}) },
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "na multicast target",
			frame: ndp(node1, ipv6.ICMPTypeNeighborAdvertisement, ll1, allN, naBody(allN, llOpt(2, node1))),
			stats: arp.Stats{Observed: 1, Malformed: 1},
		},
		{
			name:  "echo request is not ndp",
			frame: ndp(node1, ipv6.ICMPTypeEchoRequest, ll1, ll2, []byte{0, 1, 0, 1}),
		},
		{name: "ipv4 tcp ignored", frame: func(testing.TB) []byte { return ipv4TCP(1500) }},
		{name: "runt ignored", frame: func(testing.TB) []byte { return []byte{1, 2, 3} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, clk := newTable(t)
			tab.Observe(tt.frame(t))
			want := tt.stats
			want.Entries = len(tt.learn)
			if got := tab.Stats(); got != want {
				t.Errorf("Stats = %+v\nwant   %+v", got, want)
			}
			for _, w := range tt.learn {
				e, ok := tab.Lookup(w.ip)
				if !ok {
					t.Fatalf("Lookup(%v): missing", w.ip)
				}
				if e.Node != w.node || !bytes.Equal(e.MAC, prefix.MAC(w.node)) || e.Source != arp.Learned || !e.Updated.Equal(clk.Now()) {
					t.Errorf("Lookup(%v) = %+v; want node %d mac %v learned at %v", w.ip, e, w.node, prefix.MAC(w.node), clk.Now())
				}
			}
		})
	}
}

func TestConflictAndRefresh(t *testing.T) {
	tab, clk := newTable(t)
	tab.Observe(whoHas())
	t0 := clk.Now()

	clk.Advance(time.Second)
	tab.Observe(whoHas()) // same mac: refresh
	e, _ := tab.Lookup(ip1)
	if !e.Updated.Equal(t0.Add(time.Second)) || e.Node != 1 {
		t.Fatalf("after refresh: %+v", e)
	}

	clk.Advance(time.Second)
	tab.Observe(arpFrame(2, node2, ip1, node1, ip2)) // ip1 moves to node2
	e, _ = tab.Lookup(ip1)
	if e.Node != 0x0102 || !bytes.Equal(e.MAC, node2) {
		t.Fatalf("after move: %+v; want node 0x102", e)
	}
	want := arp.Stats{Observed: 3, Learned: 1, Refreshed: 1, Updated: 1, Conflicts: 1, Entries: 1}
	if got := tab.Stats(); got != want {
		t.Fatalf("Stats = %+v\nwant   %+v", got, want)
	}
	// The returned MAC is a copy.
	e.MAC[0] = 0xff
	if e2, _ := tab.Lookup(ip1); e2.MAC[0] == 0xff {
		t.Fatal("Lookup returned a MAC that aliases the table")
	}
}

func TestSeedStaticWins(t *testing.T) {
	tab, _ := newTable(t)
	tab.Seed([]peers.Peer{
		{Node: 5, Addr: "h5", IP: ip1},
		{Node: 6, Addr: "h6"}, // no IP: skipped
		{Node: 7, Addr: "h7", IP: netip.MustParseAddr("fd00::7")},
	})
	if got := tab.Stats().Entries; got != 2 {
		t.Fatalf("Entries = %d after Seed; want 2", got)
	}
	tab.Observe(arpFrame(1, node2, ip1, zeroMAC, ip2)) // disagrees with static
	e, ok := tab.Lookup(ip1)
	if !ok || e.Source != arp.Static || e.Node != 5 || !bytes.Equal(e.MAC, prefix.MAC(5)) {
		t.Fatalf("static entry changed: %+v", e)
	}
	if st := tab.Stats(); st.Conflicts != 1 || st.Updated != 0 {
		t.Fatalf("Stats = %+v; want 1 conflict, 0 updates", st)
	}
	if n := tab.InvalidateNode(5); n != 0 {
		t.Fatalf("InvalidateNode removed %d static entries", n)
	}
	// v4-mapped lookups find the v4 entry.
	if _, ok := tab.Lookup(netip.AddrFrom16(ip1.As16())); !ok {
		t.Fatal("Lookup of v4-mapped address missed")
	}
}

func TestInvalidateNodeAndNeighbors(t *testing.T) {
	tab, _ := newTable(t)
	tab.Observe(arpFrame(1, node2, ip2, zeroMAC, ip1))
	tab.Observe(ndpFrame(t, node2, ipv6.ICMPTypeNeighborAdvertisement, gua2, allN, naBody(gua2, llOpt(2, node2))))
	tab.Observe(whoHas())
	tab.Observe(ndpFrame(t, node1, ipv6.ICMPTypeNeighborSolicitation, ll1, snm, nsBody(ll2, llOpt(1, node1))))

	got := tab.Neighbors()
	wantIPs := []netip.Addr{ip1, ip2, gua2, ll1}
	if len(got) != len(wantIPs) {
		t.Fatalf("Neighbors = %v", got)
	}
	for i := range got {
		if got[i].IP != wantIPs[i] {
			t.Fatalf("Neighbors[%d] = %v; want %v (sorted)", i, got[i].IP, wantIPs[i])
		}
	}
	if n := tab.InvalidateNode(0x0102); n != 2 {
		t.Fatalf("InvalidateNode removed %d; want 2", n)
	}
	if _, ok := tab.Lookup(ip2); ok {
		t.Fatal("entry of invalidated node still present")
	}
	if _, ok := tab.Lookup(ip1); !ok {
		t.Fatal("entry of another node removed")
	}
}

func TestMaxEntries(t *testing.T) {
	tab, _ := newTable(t, arp.WithMaxEntries(2))
	for i := range 4 {
		ip := netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
		tab.Observe(arpFrame(1, node1, ip, zeroMAC, ip2))
	}
	if st := tab.Stats(); st.Entries != 2 || st.Full != 2 || st.Learned != 2 {
		t.Fatalf("Stats = %+v; want 2 entries, 2 refused", st)
	}
}

func TestLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	tab := arp.New(prefix, slog.New(slog.NewTextHandler(&buf, nil)))
	f := withByte(whoHas(), 14+7, 9) // bad opcode
	for range 1000 {
		tab.Observe(f)
	}
	lines := bytes.Count(buf.Bytes(), []byte("\n"))
	if lines == 0 || lines > 20 {
		t.Fatalf("logged %d lines for 1000 malformed frames; want a rate-limited few", lines)
	}
	if tab.Stats().Malformed != 1000 {
		t.Fatalf("Malformed = %d; want 1000", tab.Stats().Malformed)
	}
}

func TestConcurrent(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	tab, _ := newTable(t)
	n := 2000
	if testenv.Small() {
		n = 200
	}
	var wg sync.WaitGroup
	for g := range 2 { // rx and tx
		wg.Go(func() {
			for i := range n {
				ip := netip.AddrFrom4([4]byte{10, byte(g), byte(i >> 8), byte(i)})
				tab.Observe(arpFrame(1, prefix.MAC(fabric.NodeID(i)), ip, zeroMAC, ip2))
				tab.Observe(ipv4TCP(64))
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for i := range n {
				tab.Lookup(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))
				if i%100 == 0 {
					tab.Neighbors()
				}
			}
		})
	}
	wg.Go(func() {
		for i := range n / 10 {
			tab.InvalidateNode(fabric.NodeID(i))
		}
	})
	wg.Wait()
	if st := tab.Stats(); st.Observed != uint64(2*n) {
		t.Fatalf("Observed = %d; want %d", st.Observed, 2*n)
	}
}

func TestObserveNonARPAllocs(t *testing.T) {
	tab, _ := newTable(t)
	for _, f := range [][]byte{ipv4TCP(1500), ndpFrame(t, node1, ipv6.ICMPTypeEchoRequest, ll1, ll2, []byte{0, 1, 0, 1})} {
		if a := testing.AllocsPerRun(100, func() { tab.Observe(f) }); a != 0 {
			t.Fatalf("Observe(non-NDP frame) allocates %v times", a)
		}
	}
	// A refresh of a known neighbour does not allocate either.
	f := whoHas()
	tab.Observe(f)
	if a := testing.AllocsPerRun(100, func() { tab.Observe(f) }); a != 0 {
		t.Fatalf("Observe(known ARP) allocates %v times", a)
	}
}

func BenchmarkObserveNonARP(b *testing.B) { benchObserve(b, ipv4TCP(1500)) }

func BenchmarkObserveARPRefresh(b *testing.B) { benchObserve(b, whoHas()) }

func BenchmarkObserveNS(b *testing.B) { benchObserve(b, solicit(b)) }

// benchObserve measures Observe of the same frame f over and over, on a
// table that learns from its first.
func benchObserve(b *testing.B, f []byte) {
	tab, _ := newTable(b)
	b.ReportAllocs()
	for b.Loop() {
		tab.Observe(f)
	}
}

func BenchmarkLookupParallel(b *testing.B) {
	tab, _ := newTable(b)
	tab.Observe(whoHas())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tab.Lookup(ip1)
		}
	})
}

func FuzzObserve(f *testing.F) {
	f.Add(whoHas())
	f.Add(arpFrame(2, foreign, ip2, node1, ip1))
	f.Add(ndpFrame(f, node1, ipv6.ICMPTypeNeighborSolicitation, ll1, snm, nsBody(ll2, llOpt(1, node1))))
	f.Add(ndpFrame(f, node2, ipv6.ICMPTypeNeighborAdvertisement, gua2, allN, naBody(gua2, llOpt(2, node2))))
	f.Add(ndpFrame(f, node2, ipv6.ICMPTypeNeighborAdvertisement, ll2, ll1, naBody(ll2)))
	f.Add(ndpFrame(f, node2, ipv6.ICMPTypeRouterSolicitation, ll2, allR, rsBody(llOpt(1, node2))))
	f.Add(ndpFrame(f, node1, ipv6.ICMPTypeRouterAdvertisement, ll1, allN, raBody(llOpt(1, node1))))
	f.Add(ipv4TCP(64))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, frame []byte) {
		tab, _ := newTable(t, arp.WithMaxEntries(8))
		orig := bytes.Clone(frame)
		tab.Observe(frame)
		if !bytes.Equal(frame, orig) {
			t.Fatal("Observe modified the frame")
		}
		st := tab.Stats()
		if st.Entries > 1 || st.Learned > 1 {
			t.Fatalf("one frame produced %d entries", st.Entries)
		}
		for _, e := range tab.Neighbors() {
			n, ok := prefix.Node(e.MAC)
			if !ok || n != e.Node || !e.IP.IsValid() || e.IP.IsMulticast() || e.IP.IsUnspecified() {
				t.Fatalf("bad entry learned: %+v", e)
			}
		}
		if st.Learned+st.Foreign+st.Malformed > st.Observed {
			t.Fatalf("counters inconsistent: %+v", st)
		}
	})
}
