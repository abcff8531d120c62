package wire

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
	EncData(&m, peer, 7, true, []byte("hello"))
	f.Add(uint8(m.Tag), m.Payload())
	EncTwo(&m, peer, TagRMAInfo, 7, 100, 200)
	f.Add(uint8(m.Tag), m.Payload())
	EncTwo(&m, peer, TagRMAAvail, 7, 0, 5)
	f.Add(uint8(m.Tag), m.Payload())
	EncNLA(&m, peer, TagZCSrc, 7, fabric.MakeNLA(3, 9), 1<<20)
	f.Add(uint8(m.Tag), m.Payload())
	EncLen(&m, peer, TagZCPut, 7, 10)
	f.Add(uint8(m.Tag), m.Payload())
	EncCtl(&m, peer, TagShutdown, 7)
	f.Add(uint8(m.Tag), m.Payload())
	EncProbe(&m, peer, TagProbe, 7, 8080, 0)
	f.Add(uint8(m.Tag), m.Payload())
	EncProbe(&m, peer, TagProbeRep, 7, 8080, 1)
	f.Add(uint8(m.Tag), m.Payload())
	EncCtl(&m, peer, TagNoConn, 7)
	f.Add(uint8(m.Tag), m.Payload())
	EncClaim(&m, peer, 7, netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.0.0.2:80"), ClaimFlagDirect)
	f.Add(uint8(m.Tag), m.Payload())
	EncClaimDirect(&m, peer, 7, 80, 9, 1<<16, 1<<40)
	f.Add(uint8(m.Tag), m.Payload())
	EncCommit(&m, peer, 9, 80, 1)
	f.Add(uint8(m.Tag), m.Payload())
	EncClaimRDirect(&m, peer, 7, 80, 9, 1<<16, 1<<40, fabric.MakeNLA(3, 9))
	f.Add(uint8(m.Tag), m.Payload())
	EncCommitR(&m, peer, 9, 80, 1<<33, fabric.MakeNLA(4, 1))
	f.Add(uint8(m.Tag), m.Payload())
	EncClaimRep(&m, peer, 7, 80, 0, HoldReason(time.Second))
	f.Add(uint8(m.Tag), m.Payload())
	f.Add(uint8(0x50), []byte{1, 0, 0, 0, 1, 2, 3, 4})
	f.Add(uint8(0x99), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, tag uint8, p []byte) {
		if len(p) > fabric.MaxVELOPayload {
			p = p[:fabric.MaxVELOPayload]
		}
		var d Msg
		if err := Decode(fabric.Tag(tag), p, &d); err != nil {
			return
		}
		// Accepted messages re-encode to the same bytes.
		var m fabric.Message
		switch d.Tag {
		case TagVELO, TagVELOLast:
			EncData(&m, peer, d.Conn, d.Tag == TagVELOLast, d.Data)
		case TagRMAInfo, TagRMAAvail:
			EncTwo(&m, peer, d.Tag, d.Conn, d.A, d.B)
		case TagShutdown, TagReset, TagZCDone, TagNoConn:
			EncCtl(&m, peer, d.Tag, d.Conn)
		case TagProbe, TagProbeRep:
			if d.A == 0 || d.A > 0xFFFF || d.B > 1 || d.Tag == TagProbe && d.B != 0 {
				t.Fatalf("accepted bad probe %+v", d)
			}
			EncProbe(&m, peer, d.Tag, d.Conn, uint16(d.A), uint8(d.B))
		case TagZCSrc, TagZCSink:
			EncNLA(&m, peer, d.Tag, d.Conn, d.NLA, d.B)
		case TagZCWant, TagZCPut:
			EncLen(&m, peer, d.Tag, d.Conn, d.B)
		case TagClaim:
			// DecodeClaim checks the body: what it accepts re-encodes.
			sport, cport, cip, sip, flags, ok := DecodeClaim(d.Data)
			if !ok {
				return
			}
			EncClaim(&m, peer, d.Conn, netip.AddrPortFrom(cip, cport), netip.AddrPortFrom(sip, sport), flags)
		case TagClaimRep:
			// A hold's time decodes to what encodes the same reason
			// byte.
			if left, ok := HoldOf(d.Data[3]); ok && HoldReason(left) != d.Data[3] {
				t.Fatalf("hold reason %#x decodes to %v, which encodes %#x", d.Data[3], left, HoldReason(left))
			}
			EncClaimRep(&m, peer, d.Conn, binary.LittleEndian.Uint16(d.Data), d.Data[2], d.Data[3])
		case TagClaimDirect:
			port, tok, ring, id, ok := DecodeClaimDirect(d.Data)
			if !ok {
				return
			}
			EncClaimDirect(&m, peer, d.Conn, port, tok, ring, id)
		case TagCommit:
			// The COMMIT handler (agree) checks status and the reserved
			// byte: re-encode what it would accept.
			if d.Data[2] > 1 || d.Data[3] != 0 {
				return
			}
			EncCommit(&m, peer, d.Conn, binary.LittleEndian.Uint16(d.Data), d.Data[2])
		case TagClaimRDirect:
			port, tok, ring, id, nla, ok := DecodeClaimRDirect(d.Data)
			if !ok {
				return
			}
			EncClaimRDirect(&m, peer, d.Conn, port, tok, ring, id, nla)
		case TagCommitR:
			port, id, nla, ok := DecodeCommitR(d.Data)
			if !ok {
				return
			}
			EncCommitR(&m, peer, d.Conn, port, id, nla)
		default:
			t.Fatalf("decoded unknown tag %#x", d.Tag)
		}
		if m.Tag != d.Tag || string(m.Payload()) != string(p) {
			t.Fatalf("re-encode mismatch: tag %#x %x vs %x", d.Tag, m.Payload(), p)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	var b [HelloLen]byte
	h := Hello{Node: 3, VPID: 17, Conn: 9, Ring: fabric.MakeNLA(1, 0), RingSize: 1 << 16, EagerWin: 1 << 14}
	h.Encode(b[:], MagicHello)
	f.Add(b[:])
	(&Hello{Status: StatusNoFab}).Encode(b[:], MagicHello)
	f.Add(b[:])
	f.Add([]byte("EXDS"))
	f.Fuzz(func(t *testing.T, p []byte) {
		h, err := DecodeHello(p, MagicHello)
		if err != nil || h.Status != StatusOK {
			return
		}
		var out [HelloLen]byte
		h.Encode(out[:], MagicHello)
		if string(out[:]) != string(p) {
			t.Fatalf("re-encode mismatch")
		}
		if h.Flags == FlagDirect && h.Ring == 0 {
			// A direct offer (doc.go): the node only, everything else
			// zero; the connection's parameters follow in CLAIM_DIRECT.
			if h.VPID != 0 || h.Conn != 0 || h.RingSize != 0 || h.EagerWin != 0 {
				t.Fatalf("accepted direct offer with fields set %+v", h)
			}
			return
		}
		if h.Conn == 0 || h.RingSize < MinRingSize || h.EagerWin < MinEagerWin {
			t.Fatalf("accepted invalid hello %+v", h)
		}
	})
}
