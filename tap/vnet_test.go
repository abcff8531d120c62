package tap_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/internal/vnet"
	"github.com/exn-project/exn/tap"
)

// udpSum fills in f's UDP checksum (IPv4, no options): full if full,
// else the pseudo-header sum a partial checksum carries.
func udpSum(f []byte, full bool) {
	udp := f[34:]
	udp[6], udp[7] = 0, 0
	var s uint32
	s += uint32(binary.BigEndian.Uint16(f[26:])) + uint32(binary.BigEndian.Uint16(f[28:]))
	s += uint32(binary.BigEndian.Uint16(f[30:])) + uint32(binary.BigEndian.Uint16(f[32:]))
	s += 17 + uint32(len(udp))
	if full {
		for i := 0; i < len(udp); i += 2 {
			if i+1 < len(udp) {
				s += uint32(binary.BigEndian.Uint16(udp[i:]))
			} else {
				s += uint32(udp[i]) << 8
			}
		}
	}
	for s > 0xFFFF {
		s = s>>16 + s&0xFFFF
	}
	c := uint16(s)
	if full {
		c = ^c
		if c == 0 {
			c = 0xFFFF
		}
	}
	binary.BigEndian.PutUint16(udp[6:], c)
}

// udpCsumErrors reads Udp InCsumErrors from the namespace's snmp file (thread-self: /proc/net follows the main thread).
func udpCsumErrors(tb testing.TB, env *netnsEnv) int {
	tb.Helper()
	var b []byte
	var err error
	env.do(tb, func() { b, err = os.ReadFile("/proc/thread-self/net/snmp") })
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "Udp: ") {
			continue
		}
		f := strings.Fields(line)[1:]
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "InCsumErrors" {
				v, _ := strconv.Atoi(f[i])
				return v
			}
		}
	}
	tb.Fatal("no Udp InCsumErrors in /proc/net/snmp")
	return 0
}

// TestVnetKernel runs frames with virtio-net headers through the
// kernel's side of an Offload TAP: what the kernel hands over (a partial
// checksum, or a UDP super-frame when it does USO), and what it takes: a
// frame that claims nothing is verified and dropped when corrupted in
// flight, a partial checksum is completed, a super-frame is segmented,
// and a header the kernel does not accept is refused and counted.
func TestVnetKernel(t *testing.T) {
	cfg := defaultCfg
	cfg.Offload = true
	d, env := openTAP(t, cfg)
	if d.Offloads()&0x07 != 0x07 {
		t.Fatalf("offloads %#x: want at least csum, TSO4, TSO6", d.Offloads())
	}
	var in, out *net.UDPConn
	var err error
	env.do(t, func() {
		in, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(localIP, uint16(hostPort))))
		if err == nil {
			out, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peerIP, uint16(peerPort))))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	defer out.Close()
	recv := func(timeout time.Duration) []byte {
		buf := make([]byte, 65536)
		in.SetReadDeadline(time.Now().Add(timeout))
		n, err := in.Read(buf)
		if err != nil {
			return nil
		}
		return buf[:n]
	}

	// Host → device: the kernel leaves the UDP checksum partial.
	p := bytes.Repeat([]byte("offload "), 100)
	if _, err := out.Write(p); err != nil {
		t.Fatal(err)
	}
	bufs, sizes, hdrs := [][]byte{make([]byte, vnet.MaxGSOFrame)}, []int{0}, []tap.VnetHdr{{}}
	for {
		n, err := d.ReadVnet(bufs, sizes, hdrs)
		if err != nil || n != 1 {
			t.Fatalf("ReadVnet = %d, %v", n, err)
		}
		f := bufs[0][:sizes[0]]
		if len(f) < 42 || f[23] != 17 || !bytes.Equal(f[42:], p) {
			continue // not ours (the kernel's own chatter)
		}
		if h := hdrs[0]; h.Flags != vnet.NeedsCsum || h.CsumStart != 34 || h.CsumOffset != 6 || h.GSOType != vnet.GSONone {
			t.Fatalf("header %+v: want a partial UDP checksum at 34+6", h)
		}
		break
	}

	// Device → host.
	mk := func(p []byte) []byte {
		return udpFrame(peerMAC, localMAC, peerIP, localIP, uint16(peerPort), uint16(hostPort), p)
	}
	write := func(f []byte, h tap.VnetHdr) error {
		_, err := d.WriteVnet([][]byte{f}, []tap.VnetHdr{h})
		return err
	}
	good := mk([]byte("checksummed"))
	udpSum(good, true)
	if err := write(good, tap.VnetHdr{}); err != nil {
		t.Fatal(err)
	}
	if got := recv(2 * time.Second); string(got) != "checksummed" {
		t.Fatalf("complete frame: got %q", got)
	}
	before := udpCsumErrors(t, env)
	bad := mk([]byte("checksummed"))
	udpSum(bad, true)
	bad[len(bad)-1] ^= 0x20 // corrupted after the checksum was made
	if err := write(bad, tap.VnetHdr{}); err != nil {
		t.Fatal(err)
	}
	if got := recv(300 * time.Millisecond); got != nil {
		t.Fatalf("corrupted frame delivered: %q", got)
	}
	if after := udpCsumErrors(t, env); after != before+1 {
		t.Fatalf("Udp InCsumErrors %d -> %d; want one more", before, after)
	}
	partial := mk([]byte("partial"))
	udpSum(partial, false)
	if err := write(partial, tap.VnetHdr{Flags: vnet.NeedsCsum, CsumStart: 34, CsumOffset: 6}); err != nil {
		t.Fatal(err)
	}
	if got := recv(2 * time.Second); string(got) != "partial" {
		t.Fatalf("partial checksum frame: got %q", got)
	}
	// A UDP super-frame of three 1000-byte datagrams.
	big := make([]byte, 2500)
	for i := range big {
		big[i] = byte(i)
	}
	sf := mk(big)
	udpSum(sf, false)
	if err := write(sf, tap.VnetHdr{Flags: vnet.NeedsCsum, GSOType: vnet.GSOUDPL4, GSOSize: 1000, HdrLen: 42, CsumStart: 34, CsumOffset: 6}); err != nil {
		t.Fatalf("UDP super-frame: %v", err)
	}
	var got []byte
	for range 3 {
		got = append(got, recv(2*time.Second)...)
	}
	if !bytes.Equal(got, big) {
		t.Fatalf("UDP super-frame: got %d bytes back, want %d", len(got), len(big))
	}
	// A header the kernel refuses: counted, the TAP keeps working.
	errs := d.Stats().TxErrors
	if err := write(good, tap.VnetHdr{Flags: vnet.NeedsCsum, CsumStart: 34, CsumOffset: 200}); err == nil {
		t.Fatal("checksum window past the frame accepted")
	}
	if d.Stats().TxErrors != errs+1 {
		t.Fatal("refused header not counted")
	}
	if err := write(good, tap.VnetHdr{}); err != nil || string(recv(2*time.Second)) != "checksummed" {
		t.Fatalf("TAP broken after a refused header: %v", err)
	}
}

// TestVnetPlainTAP: WriteVnet with a header on a TAP without Offload is
// refused; ReadVnet returns zero headers.
func TestVnetPlainTAP(t *testing.T) {
	testenv.RequirePrivileged(t)
	d, _ := openTAP(t, defaultCfg)
	f := udpFrame(peerMAC, localMAC, peerIP, localIP, 1, 2, []byte("x"))
	if _, err := d.WriteVnet([][]byte{f}, []tap.VnetHdr{{Flags: vnet.NeedsCsum, CsumStart: 34, CsumOffset: 6}}); err == nil {
		t.Fatal("header on a plain TAP accepted")
	}
	if d.Offloads() != 0 {
		t.Fatalf("offloads %#x on a plain TAP", d.Offloads())
	}
	var opErr *net.OpError
	if _, err := d.WriteVnet([][]byte{f}, []tap.VnetHdr{{GSOType: 1}}); !errors.As(err, &opErr) {
		t.Fatalf("error %v is not a *net.OpError", err)
	}
}
