package tap_test

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/tap"
	"github.com/exn-project/exn/tap/taptest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

var (
	localMAC  = fabric.DefaultMACPrefix.MAC(1)
	peerMAC   = fabric.DefaultMACPrefix.MAC(2)
	localIP   = netip.MustParseAddr("100.64.0.1")
	peerIP    = netip.MustParseAddr("100.64.0.2")
	localPfx  = netip.PrefixFrom(localIP, 24)
	localIP6  = netip.MustParsePrefix("fd00:e8::1/64")
	hostPort  = 7777
	peerPort  = 9999
	testNSTag = "exnt"
)

// ifName returns a unique interface name: "exnt" and 8 hex digits.
func ifName(tb testing.TB) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatal(err)
	}
	return testNSTag + hex.EncodeToString(b[:])
}

// netnsEnv is a private network namespace for one test.
type netnsEnv struct {
	ns netns.NsHandle
	nl *netlink.Handle
}

// newNetns creates a network namespace that lives until the test ends.
func newNetns(tb testing.TB) *netnsEnv {
	tb.Helper()
	var ns netns.NsHandle
	onLockedThread(tb, func(orig netns.NsHandle) {
		var err error
		ns, err = netns.New() // switches this thread
		if err != nil {
			tb.Fatalf("new netns: %v", err)
		}
		if err := netns.Set(orig); err != nil {
			// The thread is stuck in the new namespace: do not return it to
			// the scheduler (the locked goroutine's exit kills the thread).
			runtime.Goexit()
		}
	})
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		tb.Fatalf("netlink handle: %v", err)
	}
	tb.Cleanup(func() { nl.Close(); ns.Close() })
	return &netnsEnv{ns: ns, nl: nl}
}

// do runs fn on a thread inside the namespace: sockets and interfaces fn
// creates belong to it.
func (e *netnsEnv) do(tb testing.TB, fn func()) {
	tb.Helper()
	onLockedThread(tb, func(orig netns.NsHandle) {
		if err := netns.Set(e.ns); err != nil {
			tb.Fatalf("enter netns: %v", err)
		}
		defer func() {
			if err := netns.Set(orig); err != nil {
				runtime.Goexit()
			}
		}()
		fn()
	})
}

// onLockedThread runs fn with the goroutine locked to its thread; orig is
// the thread's network namespace on entry, closed after fn.
func onLockedThread(tb testing.TB, fn func(orig netns.NsHandle)) {
	tb.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		tb.Fatalf("get netns: %v", err)
	}
	defer orig.Close()
	fn(orig)
}

// openIn opens a TAP with cfg (a fresh name if cfg has none) in env's
// namespace, closed when tb ends.
func openIn(tb testing.TB, env *netnsEnv, cfg tap.Config) *tap.TAP {
	tb.Helper()
	if cfg.Name == "" {
		cfg.Name = ifName(tb)
	}
	var (
		d   *tap.TAP
		err error
	)
	env.do(tb, func() { d, err = tap.Open(cfg) })
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

// openTAP opens a TAP in a fresh namespace, configured as node 1 with a
// static neighbour (node 2) so the kernel sends to it without ARP.
func openTAP(tb testing.TB, cfg tap.Config) (*tap.TAP, *netnsEnv) {
	tb.Helper()
	testenv.RequirePrivileged(tb)
	env := newNetns(tb)
	d := openIn(tb, env, cfg)
	link, err := env.nl.LinkByName(d.Name())
	if err != nil {
		tb.Fatalf("link: %v", err)
	}
	// Quiet the link: no IPv6 autoconfiguration chatter.
	env.do(tb, func() {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+d.Name()+"/disable_ipv6", []byte("1"), 0)
	})
	if err := env.nl.NeighAdd(&netlink.Neigh{
		LinkIndex: link.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: peerIP.AsSlice(), HardwareAddr: peerMAC,
	}); err != nil {
		tb.Fatalf("neigh add: %v", err)
	}
	return d, env
}

var defaultCfg = tap.Config{MAC: localMAC, MTU: 1500, Addrs: []netip.Prefix{localPfx}, Up: true}

func TestContract(t *testing.T) { runContract(t, defaultCfg) }

// TestContractOffload: a TAP with a virtio-net header keeps the Device
// contract (Read completes the host's partial UDP checksums).
func TestContractOffload(t *testing.T) {
	cfg := defaultCfg
	cfg.Offload = true
	runContract(t, cfg)
}

func runContract(t *testing.T, cfg tap.Config) {
	testenv.RequirePrivileged(t)
	testenv.VerifyNoFDLeaks(t)
	taptest.RunContract(t, func(t *testing.T) taptest.Harness {
		d, env := openTAP(t, cfg)
		var (
			out *net.UDPConn // host → device
			in  *net.UDPConn // device → host
			err error
		)
		env.do(t, func() {
			out, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peerIP, uint16(peerPort))))
			if err != nil {
				return
			}
			in, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(localIP, uint16(hostPort))))
		})
		if err != nil {
			t.Fatalf("udp: %v", err)
		}
		t.Cleanup(func() { out.Close(); in.Close() })
		return taptest.Harness{
			Dev: d,
			HostSend: func(p []byte) error {
				_, err := out.Write(p)
				return err
			},
			Frame: func(p []byte) []byte {
				return udpFrame(peerMAC, localMAC, peerIP, localIP, uint16(peerPort), uint16(hostPort), p)
			},
			HostRecv: func(timeout time.Duration) ([]byte, error) {
				buf := make([]byte, 65536)
				in.SetReadDeadline(time.Now().Add(timeout))
				n, err := in.Read(buf)
				return buf[:n], err
			},
		}
	})
}

// udpFrame builds Ethernet/IPv4/UDP; the IPv4 header checksum is computed,
// the UDP checksum is 0 (none), which IPv4 allows.
func udpFrame(src, dst net.HardwareAddr, sip, dip netip.Addr, sport, dport uint16, p []byte) []byte {
	f := make([]byte, 14+20+8+len(p))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(p)))
	ip[8] = 64
	ip[9] = 17
	s, d := sip.As4(), dip.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	udp := f[34:42]
	binary.BigEndian.PutUint16(udp[0:2], sport)
	binary.BigEndian.PutUint16(udp[2:4], dport)
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(p)))
	copy(f[42:], p)
	return f
}

func ipChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

func TestOpenConfigures(t *testing.T) {
	testenv.VerifyNoFDLeaks(t)
	cfg := defaultCfg
	cfg.MTU = 0 // default
	cfg.Addrs = []netip.Prefix{localPfx, localIP6}
	d, env := openTAP(t, cfg)
	if d.MTU() != tap.DefaultMTU || len(d.Name()) > 15 {
		t.Fatalf("MTU %d name %q", d.MTU(), d.Name())
	}
	link, err := env.nl.LinkByName(d.Name())
	if err != nil {
		t.Fatal(err)
	}
	a := link.Attrs()
	if a.MTU != 65521 || a.HardwareAddr.String() != localMAC.String() || a.TxQLen != tap.DefaultQueueLen || a.Flags&net.FlagUp == 0 {
		t.Fatalf("link: mtu %d mac %v qlen %d flags %v", a.MTU, a.HardwareAddr, a.TxQLen, a.Flags)
	}
	if _, ok := link.(*netlink.Tuntap); !ok {
		t.Fatalf("link type %T; want *netlink.Tuntap", link)
	}
	addrs, err := env.nl.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	found := map[netip.Prefix]bool{}
	for _, ad := range addrs {
		ip, _ := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		found[netip.PrefixFrom(ip.Unmap(), ones)] = true
	}
	if !found[localPfx] {
		t.Errorf("address %v missing: %v", localPfx, addrs)
	}
}

func TestIPv6NoDAD(t *testing.T) {
	testenv.RequirePrivileged(t)
	env := newNetns(t)
	d := openIn(t, env, tap.Config{MAC: localMAC, Addrs: []netip.Prefix{localIP6}, Up: true})
	link, _ := env.nl.LinkByName(d.Name())
	addrs, err := env.nl.AddrList(link, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, _ := netip.AddrFromSlice(a.IP); ip == localIP6.Addr() {
			if a.Flags&0x40 != 0 { // IFA_F_TENTATIVE
				t.Fatalf("address %v tentative (flags %#x); want NODAD", ip, a.Flags)
			}
			return
		}
	}
	t.Fatalf("address %v missing: %v", localIP6, addrs)
}

func TestCloseRemovesInterface(t *testing.T) {
	testenv.VerifyNoFDLeaks(t)
	d, env := openTAP(t, defaultCfg)
	if _, err := env.nl.LinkByName(d.Name()); err != nil {
		t.Fatalf("link before Close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err := env.nl.LinkByName(d.Name())
	if _, ok := errors.AsType[netlink.LinkNotFoundError](err); !ok {
		t.Fatalf("LinkByName after Close = %v; want LinkNotFoundError", err)
	}
}

func TestMTULimit(t *testing.T) {
	testenv.RequirePrivileged(t)
	env := newNetns(t)
	d := openIn(t, env, tap.Config{MTU: tap.MaxMTU})
	link, err := env.nl.LinkByName(d.Name())
	if err != nil {
		t.Fatal(err)
	}
	// The kernel itself refuses anything larger (Open validates first, so
	// ask the kernel directly).
	for _, mtu := range []int{tap.MaxMTU + 1, 65536} {
		if err := env.nl.LinkSetMTU(link, mtu); err == nil {
			t.Errorf("kernel accepted TAP MTU %d; MaxMTU is wrong", mtu)
		}
	}
	if _, err := tap.Open(tap.Config{Name: ifName(t), MTU: 65536}); err == nil {
		t.Error("Open accepted MTU 65536")
	}
}

func TestOpenErrorsLeaveNothing(t *testing.T) {
	testenv.RequirePrivileged(t)
	testenv.VerifyNoFDLeaks(t)
	env := newNetns(t)
	name := ifName(t)
	tests := []struct {
		name string
		cfg  tap.Config
	}{
		{"long name", tap.Config{Name: "exnt-name-too-long"}},
		{"multicast mac", tap.Config{Name: name, MAC: net.HardwareAddr{1, 0, 0, 0, 0, 1}}},
		{"mtu too small", tap.Config{Name: name, MTU: 10}},
		{"bad prefix", tap.Config{Name: name, Addrs: []netip.Prefix{{}}}},
		// Fails in the kernel after the interface exists: must be undone.
		{"duplicate address", tap.Config{Name: name, Addrs: []netip.Prefix{localPfx, localPfx}}},
	}
	for _, tt := range tests {
		var err error
		env.do(t, func() { _, err = tap.Open(tt.cfg) })
		if err == nil {
			t.Errorf("%s: Open succeeded", tt.name)
		}
		if _, lerr := env.nl.LinkByName(name); lerr == nil {
			t.Errorf("%s: interface %s left behind", tt.name, name)
		}
	}
}

func TestOpenBusy(t *testing.T) {
	d, env := openTAP(t, defaultCfg)
	var err error
	env.do(t, func() { _, err = tap.Open(tap.Config{Name: d.Name()}) })
	if err == nil {
		t.Fatal("second Open of an attached TAP succeeded")
	}
}
