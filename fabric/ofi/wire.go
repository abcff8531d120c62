package ofi

import (
	"encoding/binary"
	"fmt"

	"github.com/exn-project/exn/fabric"
)

// Wire format. Every libfabric message exnd sends is one packet of at most
// packetSize bytes: an 8-byte header word and up to 120 bytes of body, so
// one VELO message (descriptor plus payload) is exactly one 128-byte
// mailbox slot, as on Extoll; or a pBundle of up to recvSize bytes that
// carries several VELO messages of one (sender, target) pair to a target
// that said it takes them (bundle.go).
//
// Header word (little-endian bit numbers):
//
//	0..39   a fabric.Descriptor: source node, source VPID, tag, length
//	        (its MC bit stays clear: multicast is packet type pMcast)
//	40..47  the VPID addressed on the receiving node
//	48..53  epoch (6 bits) of the VPID the packet concerns, so packets of
//	        an endpoint that closed never reach its successor
//	54..59  multicast group (VELO with MC set)
//	60..63  packet type
//
// The source node and VPID are written by the sending NIC code, never by
// the caller; the receiver checks the node against the libfabric source
// address (FI_SOURCE) and drops a packet that disagrees.
const (
	headerSize = 8
	// packetSize is the largest packet: one VELO mailbox slot.
	packetSize = fabric.SlotSize
	bodyMax    = packetSize - headerSize
	// recvSize is the largest provider message: a pBundle of VELO
	// messages (bundle.go) or one packet. Receive buffers and send
	// slots are this size. 1 KiB holds 35 plain adverts or 7 full VELO
	// messages, and costs 1 MiB of receive buffers at DefaultRecvSlots.
	recvSize   = 1024
	bundleBody = recvSize - headerSize

	hdrDstShift   = 40
	hdrEpochShift = 48
	hdrGroupShift = 54
	hdrTypeShift  = 60
	descMask      = 1<<hdrDstShift - 1
	// epochMask keeps 6 bits: 64 open generations per VPID tell a stale
	// packet from a current one.
	epochMask = 0x3F
	groupMask = 0x3F
)

// ptype is a packet type.
type ptype uint8

const (
	pVELO     ptype = iota // a VELO message for the addressed VPID's mailbox
	pOpenQ                 // "is VPID d open, and how many credits do I get?"
	pOpenA                 // answer to pOpenQ: status, epoch, credits
	pCredit                // credits returned to the sender of a pair
	pClosed                // VPID closed: senders blocked on it get ErrPeerDown
	pRegQ                  // region query: key, base and size of region idx
	pRegA                  // answer to pRegQ
	pInval                 // region deregistered: drop cached keys
	pNotify                // a completer/responder notification for the target
	pHello                 // node (re)started
	pBye                   // node closing
	pMcast                 // a multicast VELO message (group in the header)
	pByeAck                // "I have stopped sending to you": the closer may go
	pInvalAck              // "no RMA of mine to that region is in flight": its MR may close
	pBundle                // several VELO messages of one pair (bundle.go)
	numPtypes
)

func (t ptype) String() string {
	names := [...]string{"velo", "openq", "opena", "credit", "closed", "regq", "rega", "inval", "notify", "hello", "bye", "mcast", "byeack", "invalack", "bundle"}
	if int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("ptype(%d)", uint8(t))
}

// header is the decoded header word.
type header struct {
	typ   ptype
	desc  fabric.Descriptor // Node/VPID: the source
	dst   fabric.VPID
	epoch uint8
	group fabric.Group
}

func (h header) encode() uint64 {
	return h.desc.Encode() | uint64(h.dst)<<hdrDstShift | uint64(h.epoch&epochMask)<<hdrEpochShift |
		uint64(h.group&groupMask)<<hdrGroupShift | uint64(h.typ)<<hdrTypeShift
}

func decodeHeader(w uint64) (header, error) {
	d, err := fabric.DecodeDescriptor(w & descMask)
	if err != nil {
		return header{}, err
	}
	h := header{
		typ: ptype(w >> hdrTypeShift), desc: d, dst: fabric.VPID(w >> hdrDstShift),
		epoch: uint8(w>>hdrEpochShift) & epochMask, group: fabric.Group(w>>hdrGroupShift) & groupMask,
	}
	if h.typ >= numPtypes {
		return header{}, fmt.Errorf("packet type %d: %w", h.typ, fabric.ErrInvalid)
	}
	return h, nil
}

// Status codes of pOpenA and pRegA.
const (
	stOK       = 0
	stNotOpen  = 1 // VPID not open
	stNoRegion = 2 // region unknown or owned by another VPID
)

// Body layouts (offsets into the packet, after the header). Each parse
// function checks the length and returns ErrInvalid for short bodies.
const (
	// pOpenA: status(1) credits(4) [flags(1)]; a node before bundles
	// sends no flags byte, and one that gets it ignores it.
	openABody = 5
	// openAFlags is the offset of pOpenA's flags; openABundles says the
	// target takes pBundle packets (its receive buffers hold recvSize).
	openAFlags   = 5
	openABundles = 1
	// pCredit: credits(4)
	creditBody = 4
	// pRegQ: region index(4) cookie(8)
	regQBody = 12
	// pRegA: cookie(8) status(1) owner(1) pad(2) key(8) base(8) size(8)
	regABody = 36
	// pInval, pInvalAck: region index(4)
	invalBody = 4
	// pNotify: 1 to rmaMerge (rma.go) fabric.Notifications, those of the
	// requests of one RMA operation
	notifyBody = fabric.NotificationSize
)

// regAnswer is the body of pRegA.
type regAnswer struct {
	cookie uint64
	status uint8
	owner  fabric.VPID
	key    uint64
	base   uint64 // remote address of offset 0 (0 unless FI_MR_VIRT_ADDR)
	size   uint64
}

func (a *regAnswer) put(b []byte) int {
	le := binary.LittleEndian
	le.PutUint64(b[0:], a.cookie)
	b[8] = a.status
	b[9] = byte(a.owner)
	b[10], b[11] = 0, 0
	le.PutUint64(b[12:], a.key)
	le.PutUint64(b[20:], a.base)
	le.PutUint64(b[28:], a.size)
	return regABody
}

func parseRegAnswer(b []byte) (regAnswer, error) {
	if len(b) < regABody {
		return regAnswer{}, fmt.Errorf("region answer: %d bytes: %w", len(b), fabric.ErrInvalid)
	}
	le := binary.LittleEndian
	a := regAnswer{
		cookie: le.Uint64(b[0:]), status: b[8], owner: fabric.VPID(b[9]),
		key: le.Uint64(b[12:]), base: le.Uint64(b[20:]), size: le.Uint64(b[28:]),
	}
	if a.status == stOK && (a.size == 0 || a.size > fabric.MaxRegionSize) {
		return regAnswer{}, fmt.Errorf("region answer: size %d: %w", a.size, fabric.ErrInvalid)
	}
	return a, nil
}

// bundleRec is a pBundle record's header size: tag and length (bundle.go).
const bundleRec = 2

// checkBundle validates a pBundle body: at least two records, each whole
// and no longer than a VELO payload.
func checkBundle(body []byte) error {
	if len(body) > bundleBody {
		return fmt.Errorf("bundle of %d bytes: %w", len(body), fabric.ErrInvalid)
	}
	k := 0
	for b := body; len(b) > 0; k++ {
		if len(b) < bundleRec {
			return fmt.Errorf("bundle record %d: torn header: %w", k, fabric.ErrInvalid)
		}
		n := int(b[1])
		if n > fabric.MaxVELOPayload || len(b) < bundleRec+n {
			return fmt.Errorf("bundle record %d: length %d of %d bytes left: %w", k, n, len(b)-bundleRec, fabric.ErrInvalid)
		}
		b = b[bundleRec+n:]
	}
	if k < 2 {
		return fmt.Errorf("bundle of %d records: %w", k, fabric.ErrInvalid)
	}
	return nil
}

func need(b []byte, n int, what string) error {
	if len(b) < n {
		return fmt.Errorf("%s: body %d bytes, want %d: %w", what, len(b), n, fabric.ErrInvalid)
	}
	return nil
}

// opctx is a libfabric operation context: a kind in the top byte and an
// index below. It is an integer, so no Go pointer travels through C.
type opctx uint64

const (
	ctxRecv      opctx = iota + 1 // a receive slot
	ctxSend                       // a VELO send slot
	ctxCtrl                       // a control send slot
	ctxRMA                        // an RMA operation slot
	ctxKindShift = 56
)

func mkctx(kind opctx, idx int) uint64 { return uint64(kind)<<ctxKindShift | uint64(idx) }
func (c opctx) kind() opctx            { return c >> ctxKindShift }
func (c opctx) index() int             { return int(c & (1<<ctxKindShift - 1)) }

func putHeader(b []byte, w uint64) { binary.LittleEndian.PutUint64(b, w) }
func getHeader(b []byte) uint64    { return binary.LittleEndian.Uint64(b) }
func le32(b []byte) uint32         { return binary.LittleEndian.Uint32(b) }
func le64(b []byte) uint64         { return binary.LittleEndian.Uint64(b) }
func putLe32(b []byte, v uint32)   { binary.LittleEndian.PutUint32(b, v) }
func putLe64(b []byte, v uint64)   { binary.LittleEndian.PutUint64(b, v) }
