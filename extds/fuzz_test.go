package extds

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
)

func FuzzDecodeMsg(f *testing.F) {
	var m fabric.Message
	peer := fabric.Addr{Node: 1, VPID: 2}
	encData(&m, peer, 7, true, []byte("hello"))
	f.Add(uint8(m.Tag), m.Payload())
	encTwo(&m, peer, TagRMAInfo, 7, 100, 200)
	f.Add(uint8(m.Tag), m.Payload())
	encTwo(&m, peer, TagRMAAvail, 7, 0, 5)
	f.Add(uint8(m.Tag), m.Payload())
	encNLA(&m, peer, TagZCSrc, 7, fabric.MakeNLA(3, 9), 1<<20)
	f.Add(uint8(m.Tag), m.Payload())
	encLen(&m, peer, TagZCPut, 7, 10)
	f.Add(uint8(m.Tag), m.Payload())
	encCtl(&m, peer, TagShutdown, 7)
	f.Add(uint8(m.Tag), m.Payload())
	encProbe(&m, peer, TagProbe, 7, 8080, 0)
	f.Add(uint8(m.Tag), m.Payload())
	encProbe(&m, peer, TagProbeRep, 7, 8080, 1)
	f.Add(uint8(m.Tag), m.Payload())
	encCtl(&m, peer, TagNoConn, 7)
	f.Add(uint8(m.Tag), m.Payload())
	encClaim(&m, peer, 7, netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.0.0.2:80"), claimDirect)
	f.Add(uint8(m.Tag), m.Payload())
	encClaimDirect(&m, peer, 7, 80, DirectInfo{Token: 9, Ring: 1 << 16, ID: 1 << 40})
	f.Add(uint8(m.Tag), m.Payload())
	encCommit(&m, peer, 9, 80, 1)
	f.Add(uint8(m.Tag), m.Payload())
	encClaimRep(&m, peer, 7, 80, 0, holdReason(time.Second))
	f.Add(uint8(m.Tag), m.Payload())
	f.Add(uint8(0x50), []byte{1, 0, 0, 0, 1, 2, 3, 4})
	f.Add(uint8(0x99), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, tag uint8, p []byte) {
		if len(p) > fabric.MaxVELOPayload {
			p = p[:fabric.MaxVELOPayload]
		}
		var d msg
		if err := decodeMsg(fabric.Tag(tag), p, &d); err != nil {
			return
		}
		// Accepted messages re-encode to the same bytes.
		var m fabric.Message
		switch d.tag {
		case TagVELO, TagVELOLast:
			encData(&m, peer, d.conn, d.tag == TagVELOLast, d.data)
		case TagRMAInfo, TagRMAAvail:
			encTwo(&m, peer, d.tag, d.conn, d.a, d.b)
		case TagShutdown, TagReset, TagZCDone, TagNoConn:
			encCtl(&m, peer, d.tag, d.conn)
		case TagProbe, TagProbeRep:
			if d.a == 0 || d.a > 0xFFFF || d.b > 1 || d.tag == TagProbe && d.b != 0 {
				t.Fatalf("accepted bad probe %+v", d)
			}
			encProbe(&m, peer, d.tag, d.conn, uint16(d.a), uint8(d.b))
		case TagZCSrc, TagZCSink:
			encNLA(&m, peer, d.tag, d.conn, d.nla, d.b)
		case TagZCWant, TagZCPut:
			encLen(&m, peer, d.tag, d.conn, d.b)
		case TagClaim:
			// claim.go checks the body: what it accepts re-encodes.
			sport, cport, cip, sip, flags, ok := decodeClaim(d.data)
			if !ok {
				return
			}
			encClaim(&m, peer, d.conn, netip.AddrPortFrom(cip, cport), netip.AddrPortFrom(sip, sport), flags)
		case TagClaimRep:
			// A hold's time (hold.go) decodes to what encodes the
			// same reason byte.
			if left, ok := holdOf(d.data[3]); ok && holdReason(left) != d.data[3] {
				t.Fatalf("hold reason %#x decodes to %v, which encodes %#x", d.data[3], left, holdReason(left))
			}
			encClaimRep(&m, peer, d.conn, binary.LittleEndian.Uint16(d.data), d.data[2], d.data[3])
		case TagClaimDirect:
			port, tok, ring, id, ok := decodeClaimDirect(d.data)
			if !ok {
				return
			}
			encClaimDirect(&m, peer, d.conn, port, DirectInfo{Token: tok, Ring: ring, ID: id})
		case TagCommit:
			// onCommit checks status and the reserved byte: re-encode
			// what it would accept.
			if d.data[2] > 1 || d.data[3] != 0 {
				return
			}
			encCommit(&m, peer, d.conn, binary.LittleEndian.Uint16(d.data), d.data[2])
		default:
			t.Fatalf("decoded unknown tag %#x", d.tag)
		}
		if m.Tag != d.tag || string(m.Payload()) != string(p) {
			t.Fatalf("re-encode mismatch: tag %#x %x vs %x", d.tag, m.Payload(), p)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	var b [helloLen]byte
	h := hello{node: 3, vpid: 17, conn: 9, ring: fabric.MakeNLA(1, 0), ringSize: 1 << 16, eagerWin: 1 << 14}
	h.encode(b[:], magicHello)
	f.Add(b[:])
	(&hello{status: statusNoFab}).encode(b[:], magicHello)
	f.Add(b[:])
	f.Add([]byte("EXDS"))
	f.Fuzz(func(t *testing.T, p []byte) {
		h, err := decodeHello(p, magicHello)
		if err != nil || h.status != statusOK {
			return
		}
		var out [helloLen]byte
		h.encode(out[:], magicHello)
		if string(out[:]) != string(p) {
			t.Fatalf("re-encode mismatch")
		}
		if h.flags == flagDirect && h.ring == 0 {
			// A direct offer (wire.go): the node only, everything else
			// zero; the connection's parameters follow in CLAIM_DIRECT.
			if h.vpid != 0 || h.conn != 0 || h.ringSize != 0 || h.eagerWin != 0 {
				t.Fatalf("accepted direct offer with fields set %+v", h)
			}
			return
		}
		if h.conn == 0 || h.ringSize < minRingSize || h.eagerWin < minEagerWin {
			t.Fatalf("accepted invalid hello %+v", h)
		}
	})
}
