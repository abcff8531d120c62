package exn

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/vnet"
)

// superTCP builds a TCP super-frame from src to dst (IPv4, or IPv6 if v6)
// carrying pay, with its offload metadata as the TAP gives it: the
// checksum field holds the pseudo-header sum, NEEDS_CSUM, GSO by mss.
func superTCP(dst, src net.HardwareAddr, v6 bool, pay []byte, mss int) ([]byte, Offload) {
	ipl := 20
	et := uint16(etherTypeIPv4)
	if v6 {
		ipl, et = 40, etherTypeIPv6
	}
	l4 := EthHeaderLen + ipl
	f := make([]byte, l4+20+len(pay))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:14], et)
	ip := f[EthHeaderLen:]
	if v6 {
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:6], uint16(20+len(pay)))
		ip[6], ip[7] = protoTCP, 64
		ip[8], ip[23] = 0xfd, 1
		ip[24], ip[39] = 0xfd, 2
	} else {
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:4], uint16(len(f)-EthHeaderLen))
		binary.BigEndian.PutUint16(ip[4:6], 0x1234)
		ip[6] = 0x40 // DF
		ip[8], ip[9] = 64, protoTCP
		copy(ip[12:16], []byte{10, 0, 0, 1})
		copy(ip[16:20], []byte{10, 0, 0, 2})
		binary.BigEndian.PutUint16(ip[10:12], ^vnet.CsumFold(vnet.CsumAdd(0, ip[:20])))
	}
	t := f[l4:]
	binary.BigEndian.PutUint16(t[0:2], 5001)
	binary.BigEndian.PutUint16(t[2:4], 40000)
	binary.BigEndian.PutUint32(t[4:8], 0xFFFFF000) // wraps inside the frame
	binary.BigEndian.PutUint32(t[8:12], 77)
	t[12], t[13] = 5<<4, 0x18|0x01 // PSH ACK FIN
	binary.BigEndian.PutUint16(t[14:16], 512)
	copy(f[l4+20:], pay)
	h, _ := parseL4(f)
	binary.BigEndian.PutUint16(t[16:18], vnet.CsumFold(pseudoSum(f, &h, len(f)-l4)))
	typ := uint8(vnet.GSOTCPv4)
	if v6 {
		typ = vnet.GSOTCPv6
	}
	return f, Offload{Flags: vnet.NeedsCsum, GSOType: typ, HdrLen: uint16(l4 + 20), GSOSize: uint16(mss),
		CsumStart: uint16(l4), CsumOffset: 16}
}

// checkSegment verifies a complete TCP frame's IP and TCP checksums the
// way a receiver does, independently of completeCsum: the sums over the
// covered bytes with the checksum in place must be all ones.
func checkSegment(tb testing.TB, f []byte) (seq uint32, flags byte, pay []byte) {
	tb.Helper()
	h, ok := parseL4(f)
	if !ok {
		tb.Fatalf("segment does not parse")
	}
	if h.ipOff+h.ipTotal != len(f) {
		tb.Fatalf("IP length %d, frame %d", h.ipTotal, len(f))
	}
	if !h.v6 && vnet.CsumFold(vnet.CsumAdd(0, f[h.ipOff:h.l4Off])) != 0xFFFF {
		tb.Fatalf("bad IPv4 header checksum")
	}
	if vnet.CsumFold(pseudoSum(f, &h, len(f)-h.l4Off)+vnet.CsumAdd(0, f[h.l4Off:])) != 0xFFFF {
		tb.Fatalf("bad TCP checksum")
	}
	t := f[h.l4Off:]
	return binary.BigEndian.Uint32(t[4:8]), t[13], f[h.hdrEnd:]
}

// lendSend sends one frame with its metadata through Lend/TransmitLentOffload.
func lendSend(tb testing.TB, e *Engine, f []byte, o Offload) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bufs := make([][]byte, 1)
	if n, err := e.Lend(ctx, bufs, true); n != 1 || err != nil {
		tb.Fatalf("Lend = %d, %v", n, err)
	}
	fr := bufs[0][:copy(bufs[0], f)]
	if n, err := e.TransmitLentOffload(ctx, [][]byte{fr}, []Offload{o}); n != 1 || err != nil {
		tb.Fatalf("TransmitLentOffload = %d, %v", n, err)
	}
}

// reassembled checks software-GSO output against the super-frame's payload.
func reassembled(tb testing.TB, frames [][]byte, pay []byte, mss int) {
	tb.Helper()
	var got []byte
	for i, f := range frames {
		seq, flags, p := checkSegment(tb, f)
		if want := uint32(0xFFFFF000) + uint32(i*mss); seq != want {
			tb.Fatalf("segment %d: seq %#x, want %#x", i, seq, want)
		}
		if last := i == len(frames)-1; (flags&0x01 != 0) != last || (flags&0x08 != 0) != last {
			tb.Fatalf("segment %d of %d: flags %#x (FIN/PSH on the last only)", i, len(frames), flags)
		}
		if i < len(frames)-1 && len(p) != mss {
			tb.Fatalf("segment %d: %d payload bytes, want %d", i, len(p), mss)
		}
		got = append(got, p...)
	}
	if !bytes.Equal(got, pay) {
		tb.Fatalf("payload differs after segmentation (%d vs %d bytes)", len(got), len(pay))
	}
}

func TestOffloadNegotiation(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		a, b := pair(t, Config{MTU: 1500, Offload: capAll})
		pay := make([]byte, 20000)
		for i := range pay {
			pay[i] = byte(i*7 + 3)
		}
		const mss = 1400 // fits the MTU under IPv6's 40-byte header too
		f, o := superTCP(b.eng.MAC(), a.eng.MAC(), v6, pay, mss)
		// A first frame says hello; until the answer is back B counts as
		// a peer without offload (TestOffloadOldPeer covers that path).
		mustTransmit(t, a.eng, frame(b.eng.MAC(), a.eng.MAC(), 100, 1))
		b.link.wait(t, 1, 5*time.Second)
		eventually(t, "hello answered", func() bool { return a.eng.peerCaps(b.nic.Node()) == capAll })
		// Now the super-frame goes whole with its metadata.
		lendSend(t, a.eng, f, o)
		got := b.link.wait(t, 2, 5*time.Second)
		if !bytes.Equal(got[1], f) || b.link.offs[1] != o {
			t.Fatalf("super-frame: %d bytes with %+v, want %d bytes with %+v", len(got[1]), b.link.offs[1], len(f), o)
		}
		// What B's kernel would do with it: segments that add up.
		seg := make([]byte, 1514)
		var segs [][]byte
		for k := range segments(got[1], &o) {
			segs = append(segs, append([]byte(nil), seg[:segment(seg, got[1], &o, k)]...))
		}
		reassembled(t, segs, pay, mss)
		// A frame the sending kernel called DATA_VALID arrives without
		// the claim: the receiving kernel verifies it.
		plain, po := superTCP(b.eng.MAC(), a.eng.MAC(), v6, pay[:1000], 0)
		h, _ := parseL4(plain)
		vnet.CompleteCsum(plain, h.l4Off, 16)
		lendSend(t, a.eng, plain, Offload{Flags: vnet.DataValid})
		got = b.link.wait(t, 3, 5*time.Second)
		if !bytes.Equal(got[2], plain) || b.link.offs[2] != (Offload{}) {
			t.Fatalf("DATA_VALID frame delivered with %+v (offload of the source %+v)", b.link.offs[2], po)
		}
		sa, sb := a.eng.Stats(), b.eng.Stats()
		if sa.TxGSOSplit != 0 || sa.TxOffloaded != 1 || sb.RxOffloaded != 1 || sb.TotalDrops() != 0 {
			t.Fatalf("stats: split %d offloaded %d rx offloaded %d drops %s", sa.TxGSOSplit, sa.TxOffloaded, sb.RxOffloaded, dropsString(sb))
		}
		quiet(t, a.eng)
	}
}

// TestOffloadOldPeer: a peer that never answers hellos (an engine
// without offload drops them as bad-tag) gets complete frames: super-
// frames segmented, partial checksums completed, never dropped.
func TestOffloadOldPeer(t *testing.T) {
	c := mem.NewCluster()
	a := newNodes(t, c, Config{MTU: 1500, Offload: capAll}, 1)[0]
	b := newNodes(t, c, Config{MTU: 1500}, 2)[0]
	pay := make([]byte, 9000)
	for i := range pay {
		pay[i] = byte(i)
	}
	const mss = 1000
	f, o := superTCP(b.eng.MAC(), a.eng.MAC(), false, pay, mss)
	lendSend(t, a.eng, f, o)
	n := 9
	eventually(t, "hello reply", func() bool { return a.eng.Stats().Hellos == 1 })
	lendSend(t, a.eng, f, o)
	got := b.link.wait(t, 2*n, 5*time.Second)
	reassembled(t, got[:n], pay, mss)
	reassembled(t, got[n:], pay, mss)
	// A plain frame with a partial checksum, by rendezvous: completed.
	small, so := superTCP(b.eng.MAC(), a.eng.MAC(), false, pay[:1200], 0)
	so.GSOType, so.GSOSize = vnet.GSONone, 0
	lendSend(t, a.eng, small, so)
	got = b.link.wait(t, 2*n+1, 5*time.Second)
	if _, _, p := checkSegment(t, got[2*n]); !bytes.Equal(p, pay[:1200]) {
		t.Fatal("payload of the checksummed frame differs")
	}
	if s := a.eng.Stats(); s.TxGSOSplit != 2 || s.TxCsumSW != 1 || s.TxOffloaded != 0 {
		t.Fatalf("split %d, csum in software %d, offloaded %d", s.TxGSOSplit, s.TxCsumSW, s.TxOffloaded)
	}
	if s := b.eng.Stats(); s.TotalDrops() != 0 || s.RxOffloaded != 0 {
		t.Fatalf("receiver drops %s, offloaded %d", dropsString(s), s.RxOffloaded)
	}
	quiet(t, a.eng)
}

// TestOffloadBad: a virtio-net header that does not fit its frame is
// dropped at the sender (tx-offload-malformed) and its slot comes back;
// an offload advert to an engine that announced none, or whose fields do
// not fit the pulled frame, is dropped at the receiver
// (offload-malformed); and the engines keep working.
func TestOffloadBad(t *testing.T) {
	c := mem.NewCluster()
	ns := newNodes(t, c, Config{MTU: 1500, Offload: capAll}, 1, 2)
	plain := newNodes(t, c, Config{MTU: 1500}, 3)[0]
	a, b := ns[0], ns[1]
	pay := bytes.Repeat([]byte{9}, 5000)
	f, o := superTCP(b.eng.MAC(), a.eng.MAC(), false, pay, 1448)

	bad := []Offload{
		{Flags: 4},
		{Flags: vnet.NeedsCsum | vnet.DataValid},
		{Flags: vnet.NeedsCsum, CsumStart: 4, CsumOffset: 16},
		{Flags: vnet.NeedsCsum, CsumStart: uint16(len(f) - 1), CsumOffset: 0},
		{CsumStart: 34},
		{GSOType: 9, Flags: vnet.NeedsCsum, GSOSize: 100, CsumStart: 34, CsumOffset: 16},
		{GSOType: vnet.GSOTCPv6, Flags: vnet.NeedsCsum, GSOSize: 1448, CsumStart: 34, CsumOffset: 16},
		{GSOType: vnet.GSOUDPL4, Flags: vnet.NeedsCsum, GSOSize: 1448, CsumStart: 34, CsumOffset: 6},
		{GSOType: vnet.GSOTCPv4, Flags: vnet.NeedsCsum, GSOSize: 0, CsumStart: 34, CsumOffset: 16},
		{GSOType: vnet.GSOTCPv4, Flags: vnet.NeedsCsum, GSOSize: 1500, CsumStart: 34, CsumOffset: 16},
		{GSOType: vnet.GSOTCPv4, GSOSize: 1448, CsumStart: 34, CsumOffset: 16},
		{GSOType: vnet.GSOTCPv4, Flags: vnet.NeedsCsum, GSOSize: 1448, CsumStart: 34, CsumOffset: 6},
	}
	for _, bo := range bad {
		lendSend(t, a.eng, f, bo)
	}
	if s := a.eng.Stats(); s.Drops[DropTxOffload]+s.Drops[DropOversize] != uint64(len(bad)) || s.Drops[DropTxOffload] < 7 || s.TxSlotsLent != 0 {
		t.Fatalf("tx-offload-malformed %d (want %d), slots lent %d", s.Drops[DropTxOffload], len(bad), s.TxSlotsLent)
	}

	// Forged offload adverts from a raw endpoint.
	at := newAttacker(t, c, 4)
	copy(at.reg.Buf, f)
	x := func(off Offload, n int) []byte {
		b := make([]byte, advertXLen)
		a := advert{nla: at.reg.NLA, len: uint32(n), off: off}
		a.encodeX(b)
		return b
	}
	at.send(t, msg(plain.nic.Node(), tagAdvertX, x(o, len(f))))                                                         // not announced
	at.send(t, msg(b.nic.Node(), tagAdvertX, x(o, len(f))[:20]))                                                        // short
	at.send(t, msg(b.nic.Node(), tagAdvertX, x(Offload{Flags: vnet.DataValid}, len(f)-5000)))                           // a claim we do not take
	at.send(t, msg(b.nic.Node(), tagAdvertX, x(Offload{Flags: vnet.NeedsCsum, CsumStart: 40, CsumOffset: 2000}, 1000))) // window past the frame
	bo := o
	bo.GSOType = vnet.GSOTCPv6
	at.send(t, msg(b.nic.Node(), tagAdvertX, x(bo, len(f)))) // type does not match the frame
	eventually(t, "forged adverts counted", func() bool {
		return plain.eng.Stats().Drops[DropOffloadForged] == 1 && b.eng.Stats().Drops[DropOffloadForged] == 4
	})
	// The real thing still passes, from the attacker too.
	at.send(t, msg(b.nic.Node(), tagAdvertX, x(o, len(f))))
	got := b.link.wait(t, 1, 5*time.Second)
	if !bytes.Equal(got[0], f) || b.link.offs[0] != o {
		t.Fatal("valid offload advert not delivered with its metadata")
	}
	quiet(t, b.eng)
}

func TestSegmentUDP(t *testing.T) {
	// A UDP super-frame (USO): each segment its own datagram.
	pay := make([]byte, 4000)
	for i := range pay {
		pay[i] = byte(i * 13)
	}
	f, o := superTCP(nodeMAC(2), nodeMAC(1), true, nil, 1)
	// Rebuild as UDP/IPv6 by hand: 14 + 40 + 8 + payload.
	f = append(f[:EthHeaderLen+40], make([]byte, 8+len(pay))...)
	ip := f[EthHeaderLen:]
	ip[6] = protoUDP
	binary.BigEndian.PutUint16(ip[4:6], uint16(8+len(pay)))
	u := f[EthHeaderLen+40:]
	binary.BigEndian.PutUint16(u[0:2], 1)
	binary.BigEndian.PutUint16(u[2:4], 2)
	binary.BigEndian.PutUint16(u[4:6], uint16(8+len(pay)))
	copy(u[8:], pay)
	h, _ := parseL4(f)
	binary.BigEndian.PutUint16(u[6:8], vnet.CsumFold(pseudoSum(f, &h, 8+len(pay))))
	o = Offload{Flags: vnet.NeedsCsum, GSOType: vnet.GSOUDPL4, GSOSize: 1200, CsumStart: EthHeaderLen + 40, CsumOffset: 6}
	if !o.check(f, 1514, true) {
		t.Fatal("valid UDP super-frame refused")
	}
	seg := make([]byte, 1514)
	var got []byte
	for k := range segments(f, &o) {
		s := seg[:segment(seg, f, &o, k)]
		h, _ := parseL4(s)
		if vnet.CsumFold(pseudoSum(s, &h, len(s)-h.l4Off)+vnet.CsumAdd(0, s[h.l4Off:])) != 0xFFFF {
			t.Fatalf("segment %d: bad UDP checksum", k)
		}
		if int(binary.BigEndian.Uint16(s[h.l4Off+4:])) != len(s)-h.l4Off || h.ipOff+h.ipTotal != len(s) {
			t.Fatalf("segment %d: lengths", k)
		}
		got = append(got, s[h.hdrEnd:]...)
	}
	if !bytes.Equal(got, pay) {
		t.Fatal("UDP payload differs")
	}
}

// FuzzOffload: any metadata with any frame either fails check or can be
// segmented into frames that fit the MTU with valid checksums, and
// completeCsum stays inside the frame.
func FuzzOffload(f *testing.F) {
	sf, so := superTCP(nodeMAC(2), nodeMAC(1), false, bytes.Repeat([]byte{1}, 3000), 1000)
	enc := func(o Offload) []byte {
		a := advert{nla: 1 << 48, len: 1, off: o}
		b := make([]byte, advertXLen)
		a.encodeX(b)
		return b[16:]
	}
	f.Add(enc(so), sf)
	f.Add(enc(Offload{Flags: vnet.NeedsCsum, CsumStart: 34, CsumOffset: 16}), sf[:200])
	f.Add(enc(Offload{GSOType: vnet.GSOTCPv6 | vnet.GSOECN, Flags: 1, GSOSize: 1, CsumStart: 54, CsumOffset: 16}), sf)
	f.Fuzz(func(t *testing.T, hdr, frame []byte) {
		if len(hdr) < 10 {
			return
		}
		p := make([]byte, advertXLen)
		copy(p[16:], hdr)
		binary.LittleEndian.PutUint64(p, 1<<48)
		binary.LittleEndian.PutUint32(p[8:], uint32(len(frame)))
		a, reason := decodeAdvertX(p, 1514)
		o := a.off
		if reason != DropNone || !o.check(frame, 1514, true) {
			return
		}
		f := append([]byte(nil), frame...)
		if o.GSOType == vnet.GSONone {
			if o.Flags&vnet.NeedsCsum != 0 {
				vnet.CompleteCsum(f, int(o.CsumStart), int(o.CsumOffset))
			}
			return
		}
		seg := make([]byte, 1514)
		total := 0
		for k := range segments(f, &o) {
			s := seg[:segment(seg, f, &o, k)]
			h, ok := parseL4(s)
			if !ok || len(s) > 1514 || h.ipOff+h.ipTotal != len(s) {
				t.Fatalf("segment %d: %d bytes, parses %v", k, len(s), ok)
			}
			if vnet.CsumFold(pseudoSum(s, &h, len(s)-h.l4Off)+vnet.CsumAdd(0, s[h.l4Off:])) != 0xFFFF {
				t.Fatalf("segment %d: bad checksum", k)
			}
			total += len(s) - h.hdrEnd
		}
		if h, _ := parseL4(f); total != len(f)-h.hdrEnd {
			t.Fatalf("segments carry %d of %d payload bytes", total, len(f)-h.hdrEnd)
		}
	})
}

// FuzzHello: any hello payload is recorded (only the known capability
// bits) or counted as hello-malformed; one asking for an answer queues
// exactly one.
func FuzzHello(f *testing.F) {
	f.Add([]byte{1, 7, 1})
	f.Add([]byte{0, 7, 0})
	f.Add([]byte{9, 0xFF, 0xFF, 1, 2})
	f.Add([]byte{1})
	f.Fuzz(func(t *testing.T, p []byte) {
		e := &Engine{peers: make([]atomic.Uint32, 1<<16), ctlq: make(chan ctlMsg, 1), log: slog.New(slog.DiscardHandler)}
		e.gotHello(5, p)
		ok := len(p) >= helloLen && p[0] >= helloVersion
		if !ok {
			if e.ctr.drops[DropHelloMalformed].Load() != 1 || e.peers[5].Load() != 0 {
				t.Fatal("malformed hello not counted, or recorded")
			}
			return
		}
		if caps := e.peerCaps(5); caps != p[1]&capAll {
			t.Fatalf("caps %#x from %#x", caps, p[1])
		}
		if want := int(p[2] & helloReply); len(e.ctlq) != want {
			t.Fatalf("%d answers queued, want %d", len(e.ctlq), want)
		}
	})
}
