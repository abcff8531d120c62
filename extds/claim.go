package extds

// Out-of-band agreement (CLAIM / CLAIM_REPLY): nothing is written into a
// shadow TCP connection before both nodes agreed, over the fabric, that
// the process that accepted that very connection speaks EXT-DS. The
// server's agreement is keyed by the connection's TCP 4-tuple and given
// only when the accepting side claims the accepted socket (Device.Claim,
// which exnd's shim server calls for a shimmed accept) — or at once for a
// port served by an in-process Listener, which always speaks EXT-DS. The
// state machine is in docs/extds.md ("Negotiation").
//
// Wire (VELO, tag 0x4E / 0x4F, conn field = the client's token):
//
//	CLAIM        sport u16, cport u16, flags u32, client IP [16], server IP [16]   44 bytes
//	CLAIM_REPLY  sport u16, status u8 (1 agreed, 0 declined), reason u8        8 bytes
//
// reason: 1 no listener, 2 late, 3 busy, 4 mismatch; 0x80 | q the port
// is on hold for q more holdQuantum units (hold.go).
//
// flags: bit 0, the client can take a direct connection (claimdirect.go,
// which also has the direct answer and its COMMIT); other bits zero.
// IPs are 16-byte (IPv4 as IPv4-mapped). Claims are matched by token,
// fabric source (which a sender cannot forge) and port; the server also
// checks that the client IP resolves to the CLAIM's source node.
//
// Locking: claimTable.mu guards its map; it is a leaf lock (nothing is
// sent or waited for under it). Replies go through the control sender.

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Tags of the out-of-band agreement (after PROBE_REPLY).
const (
	TagClaim    fabric.Tag = 0x4E
	TagClaimRep fabric.Tag = 0x4F
)

const (
	claimLen    = 44
	claimRepLen = 8
)

// Limits, with why.
const (
	// DefaultClaimTimeout bounds the client's wait for the server's
	// agreement: the accepting process must call accept within it. A
	// registered listener whose acceptor never claims (no shim, no exnd
	// access, EXTDS_MODE=off) costs a client this once, then the address
	// is cached as TCP for a minute (negativeTTL).
	DefaultClaimTimeout = 300 * time.Millisecond
	// claimTombstone keeps a claim the acceptor gave up on (it went plain
	// TCP) so that a late CLAIM is declined at once instead of waiting.
	claimTombstone = 5 * time.Second
	// maxClaims bounds the table (offers not yet claimed, claims not yet
	// offered, tombstones): a peer cannot make exnd keep unbounded state.
	// A full table declines ("busy").
	maxClaims = 8192
)

// Decline reasons carried in CLAIM_REPLY.
const (
	declineNoListener uint8 = 1 // no listener registered for the port
	declineLate       uint8 = 2 // the acceptor already went plain TCP
	declineBusy       uint8 = 3 // claim table full
	declineMismatch   uint8 = 4 // the client IP does not resolve to the sender
)

// TupleKey is a TCP connection as the server sees it: its local
// (listening) address and the client's address.
type TupleKey struct {
	Local, Remote netip.AddrPort
}

func normAP(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

type claimState uint8

const (
	stOffered   claimState = iota + 1 // CLAIM arrived, nobody claimed yet
	stAccepting                       // claimed, no CLAIM yet
	stAgreed                          // both: the agreement was sent
	stClosed                          // the acceptor went TCP: decline
	stDirect                          // claimed by ClaimDirect and a direct CLAIM came: AgreeDirect answers
	stReplied                         // CLAIM_DIRECT sent: waiting for COMMIT
	stHeld                            // the CLAIM was declined by a hold (hold.go): no hello comes
	stSkipped                         // its acceptor took it as TCP because of a hold (AcceptOnHold, SkippedByHold): a CLAIM is declined as held
)

type claimEntry struct {
	st      claimState
	token   uint32
	from    fabric.Addr
	vd      *vdev
	expires time.Time // stOffered, stClosed
	sport   uint16    // the server port (COMMIT's check)
	// Direct agreement (claimdirect.go).
	offerDirect bool       // the CLAIM offered a direct connection
	wake        func()     // ClaimDirect's hook (nil: Claim's acceptor, no direct)
	commit      chan uint8 // cap 1, stReplied: COMMIT's status
	ck          commitKey  // stReplied: its key in the commit table
}

type claimTable struct {
	mu     sync.Mutex
	m      map[TupleKey]*claimEntry
	ports  map[uint16]int // ports whose accepts must be claimed → registrations
	waits  map[uint32]*claimWait
	nextTk uint32
	// commits: direct answers sent, by (client node, server token).
	commits map[commitKey]*claimEntry
	spans   map[uint16]holdSpan // listener port → its latest hold, kept after it ends (hold.go)
}

// claimWait is a client waiting for CLAIM_REPLY.
type claimWait struct {
	vd     *vdev
	peer   fabric.Addr
	port   uint16
	direct bool          // the CLAIM offered a direct connection
	ch     chan claimAns // cap 1
}

func (t *claimTable) init() {
	t.m = make(map[TupleKey]*claimEntry)
	t.ports = make(map[uint16]int)
	t.waits = make(map[uint32]*claimWait)
	t.commits = make(map[commitKey]*claimEntry)
	t.spans = make(map[uint16]holdSpan)
}

// RegisterClaimPort says a listener on TCP port is served on this node
// by processes that claim each accepted socket (Device.Claim): a peer's
// CLAIM for a connection to port is agreed only once its acceptor
// claimed it, and a connection nobody claims stays plain TCP with
// nothing written into it. It opens the port's vdev. unregister is
// idempotent; registrations are counted.
func (d *Device) RegisterClaimPort(port uint16) (unregister func(), err error) {
	if _, err := d.vdev(int(port & 0xF)); err != nil {
		return func() {}, err
	}
	d.mu.RLock()
	closed := d.closed
	d.mu.RUnlock()
	if closed {
		return func() {}, net.ErrClosed
	}
	t := &d.claims
	t.mu.Lock()
	t.ports[port]++
	t.mu.Unlock()
	return uncount(&t.mu, t.ports, port, func() {}), nil
}

// Claim is an acceptor's claim on one accepted connection (Device.Claim).
type Claim struct {
	d   *Device
	key TupleKey
}

// Claim says the caller accepted the TCP connection key and will read an
// EXT-DS hello on it if the client sends one: the client's CLAIM (now or
// when it arrives) is agreed. The caller must Close the claim once it
// decided the connection's mode.
func (d *Device) Claim(key TupleKey) *Claim { return d.claim(key, nil) }

// claim is Claim, or ClaimDirect when wake is not nil.
func (d *Device) claim(key TupleKey, wake func()) *Claim {
	key = TupleKey{normAP(key.Local), normAP(key.Remote)}
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	switch {
	case e != nil && e.st == stHeld:
		// Declined by a hold before the acceptor came: Held reports it.
	case e != nil && e.st == stOffered && wake != nil && e.offerDirect:
		e.st, e.wake = stDirect, wake // DirectPending: the caller answers
	case e != nil && e.st == stOffered:
		e.st = stAgreed
		d.claimReply(e, key.Local.Port(), 1, 0)
	case e == nil && len(t.m) < maxClaims:
		t.m[key] = &claimEntry{st: stAccepting, wake: wake}
	case e == nil:
		// Full: no entry, so a CLAIM is declined (busy) and the
		// client stays TCP; Agreed reports false.
	default:
		// A stale tombstone of a reused 4-tuple.
		e.st, e.wake = stAccepting, wake
	}
	return &Claim{d: d, key: key}
}

// Agreed reports whether the client was told to go ahead (it will send
// an EXT-DS hello unless it gave up first).
func (c *Claim) Agreed() bool { return c.state() == stAgreed }

// state is the claim's entry's state, 0 if it has none.
func (c *Claim) state() claimState {
	t := &c.d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[c.key]; e != nil {
		return e.st
	}
	return 0
}

// Close ends the claim and reports whether it was agreed. A claim not
// agreed becomes a tombstone: a CLAIM arriving later is declined. It is
// idempotent.
func (c *Claim) Close() (agreed bool) {
	t := &c.d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[c.key]
	switch {
	case e == nil:
		return false
	case e.st == stAgreed:
		delete(t.m, c.key)
		return true
	case e.st == stAccepting:
		e.st, e.expires, e.wake = stClosed, time.Now().Add(claimTombstone), nil
	case e.st == stHeld:
		delete(t.m, c.key)
	case e.st == stDirect, e.st == stReplied:
		// Decided by AgreeDirect (or failed): a late COMMIT is dropped.
		delete(t.m, c.key)
		if t.commits[e.ck] == e {
			delete(t.commits, e.ck)
		}
	}
	return false
}

// claimReply queues a CLAIM_REPLY; under t.mu (the control sender never
// takes it).
func (d *Device) claimReply(e *claimEntry, port uint16, status, reason uint8) {
	d.queueCtl(ctrlReq{vd: e.vd, peer: e.from, conn: e.token, tag: TagClaimRep, port: port, status: status, reason: reason})
}

func decodeClaim(p []byte) (sport, cport uint16, cip, sip netip.Addr, flags uint32, ok bool) {
	if len(p) != claimLen-hdrLen {
		return 0, 0, netip.Addr{}, netip.Addr{}, 0, false
	}
	if flags = binary.LittleEndian.Uint32(p[4:]); flags&^claimDirect != 0 {
		return 0, 0, netip.Addr{}, netip.Addr{}, 0, false
	}
	sport, cport = binary.LittleEndian.Uint16(p), binary.LittleEndian.Uint16(p[2:])
	cip = netip.AddrFrom16([16]byte(p[8:24])).Unmap()
	sip = netip.AddrFrom16([16]byte(p[24:40])).Unmap()
	return sport, cport, cip, sip, flags, sport != 0 && cport != 0
}

func encClaim(fm *fabric.Message, peer fabric.Addr, token uint32, local, remote netip.AddrPort, flags uint32) {
	putHdr(fm, peer, TagClaim, token, claimLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], remote.Port())
	binary.LittleEndian.PutUint16(fm.Data[6:], local.Port())
	binary.LittleEndian.PutUint32(fm.Data[8:], flags)
	c, s := local.Addr().As16(), remote.Addr().As16()
	copy(fm.Data[12:28], c[:])
	copy(fm.Data[28:44], s[:])
}

func encClaimRep(fm *fabric.Message, peer fabric.Addr, token uint32, port uint16, status, reason uint8) {
	putHdr(fm, peer, TagClaimRep, token, claimRepLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = status, reason
}

// onClaim answers, or records, a peer's CLAIM (rx loop; never blocks).
func (d *Device) onClaim(v *vdev, from fabric.Addr, m *msg) {
	sport, cport, cip, sip, flags, ok := decodeClaim(m.data)
	if !ok || int(sport&0xF) != v.idx {
		d.drop(DropProbe, "from", from, "why", "malformed claim or wrong vdev")
		return
	}
	d.ctr.probesServed.Add(1)
	offerDirect := flags&claimDirect != 0
	reply := &claimEntry{token: m.conn, from: from, vd: v, sport: sport, offerDirect: offerDirect}
	if res := d.cfg.resolver; res != nil {
		if n, known := res.Resolve(cip); known && n != from.Node {
			d.claimReplyNow(reply, sport, 0, declineMismatch)
			return
		}
	}
	key := TupleKey{netip.AddrPortFrom(sip, sport), netip.AddrPortFrom(cip, cport)}
	now := time.Now()
	skipped := d.acceptedInHold(key, now) // before t.mu: a kernel lookup (hold.go)
	var wake func()
	defer func() {
		if wake != nil {
			wake() // after the unlock below (deferred later, run first)
		}
	}()
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ports[sport] == 0 {
		d.mu.RLock()
		auto := d.ports[sport] > 0
		d.mu.RUnlock()
		if auto {
			d.claimReply(reply, sport, 1, 0) // an in-process Listener: always EXT-DS
		} else {
			d.claimReply(reply, sport, 0, declineNoListener)
		}
		return
	}
	e := t.m[key]
	if e == nil {
		if left := t.holdLeftLocked(sport, now); left > 0 || skipped {
			// On hold: the acceptors do not claim (hold.go). One
			// that does after all (its window ended) learns from the
			// entry that no hello comes (Claim.Held). After the hold,
			// its acceptor skipped asking (acceptedInHold): nothing
			// left to cache.
			d.claimReply(reply, sport, 0, holdReason(left))
			if len(t.m) < maxClaims {
				reply.st, reply.expires = stHeld, now.Add(claimTombstone)
				t.m[key] = reply
			}
			return
		}
	}
	switch {
	case e == nil && len(t.m) >= maxClaims:
		d.claimReply(reply, sport, 0, declineBusy)
	case e == nil:
		reply.st, reply.expires = stOffered, now.Add(2*DefaultClaimTimeout)
		t.m[key] = reply
	case e.st == stAccepting && e.wake != nil && offerDirect:
		e.st, e.token, e.from, e.vd, e.sport, e.offerDirect = stDirect, m.conn, from, v, sport, true
		wake = e.wake
	case e.st == stAccepting:
		e.st, e.token, e.from, e.vd, e.sport = stAgreed, m.conn, from, v, sport
		d.claimReply(e, sport, 1, 0)
	case e.st == stClosed:
		d.claimReply(reply, sport, 0, declineLate)
	case e.st == stSkipped:
		// Its acceptor took it as plain TCP because of a hold
		// (AcceptOnHold, SkippedByHold): declined as held, with what
		// is left of the hold (none once it is over) for the client
		// to cache.
		delete(t.m, key)
		d.claimReply(reply, sport, 0, holdReason(t.holdLeftLocked(sport, now)))
	default:
		d.drop(DropProbe, "from", from, "why", "duplicate claim")
	}
}

func (d *Device) claimReplyNow(e *claimEntry, port uint16, status, reason uint8) {
	d.claims.mu.Lock()
	d.claimReply(e, port, status, reason)
	d.claims.mu.Unlock()
}

// statusBody decodes the body that CLAIM_REPLY and COMMIT begin with: the
// port, then a status byte that is 0 or 1. ok is false if the message is
// not n bytes long (header included) or the status is anything else.
func statusBody(m *msg, n int) (port uint16, status uint8, ok bool) {
	if len(m.data) != n-hdrLen || m.data[2] > 1 {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint16(m.data), m.data[2], true
}

// waitingLocked returns the client's claim that an answer from peer on
// vdev v for token and port belongs to, or nil (t.mu held).
func (t *claimTable) waitingLocked(v *vdev, peer fabric.Addr, token uint32, port uint16) *claimWait {
	w := t.waits[token]
	if w == nil || w.vd != v || w.peer != peer || w.port != port {
		return nil
	}
	return w
}

// onClaimReply hands an answer to the client waiting for it.
func (d *Device) onClaimReply(v *vdev, from fabric.Addr, m *msg) {
	port, _, ok := statusBody(m, claimRepLen)
	if !ok {
		d.drop(DropProbe, "from", from, "why", "malformed claim reply")
		return
	}
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.waitingLocked(v, from, m.conn, port)
	if w == nil {
		d.drop(DropProbe, "from", from, "token", m.conn, "why", "claim reply matches no claim")
		return
	}
	select {
	case w.ch <- claimAns{status: m.data[2], reason: m.data[3]}:
	default:
		d.drop(DropProbe, "from", from, "token", m.conn, "why", "duplicate claim reply")
	}
}

// sweepClaims drops offers nobody claimed in time and old tombstones
// (housekeeping tick).
func (d *Device) sweepClaims(now time.Time) {
	t := &d.claims
	t.mu.Lock()
	for k, e := range t.m {
		if (e.st == stOffered || e.st == stClosed || e.st == stHeld || e.st == stSkipped) && now.After(e.expires) {
			delete(t.m, k)
		}
	}
	t.mu.Unlock()
}

// errNoClaim: no agreement in time (the caller falls back, nothing sent).
var errNoClaim = errors.New("extds: no claim")

// offer asks node whether the acceptor of the TCP connection
// local→remote (the client's view) speaks EXT-DS, and waits at most the
// claim timeout. It returns agreed when agreed; a FallbackReason when
// declined or unanswered (nothing was written to the connection); an
// error only when ctx ended, the Device closed, or a direct connection
// could not be committed. With open (the caller can take a direct
// connection) the CLAIM offers one, and an acceptor that makes one
// answers with its name: open is called and, when it succeeds, the
// result is its DirectInfo (claimdirect.go).
func (d *Device) offer(ctx context.Context, node fabric.NodeID, local, remote netip.AddrPort, open func(DirectInfo) error) (why FallbackReason, agreed bool, di *DirectInfo, err error) {
	local, remote = normAP(local), normAP(remote)
	v, peer, err := d.askTarget(node, local.Port(), remote.Port())
	if err != nil {
		return 0, false, nil, err
	}
	w := &claimWait{vd: v, peer: peer, port: remote.Port(), direct: open != nil, ch: make(chan claimAns, 1)}
	t := &d.claims
	t.mu.Lock()
	tok := freeID(&t.nextTk, t.waits)
	t.waits[tok] = w
	t.mu.Unlock()
	var flags uint32
	if w.direct {
		flags = claimDirect
	}
	var fm [1]fabric.Message
	encClaim(&fm[0], peer, tok, local, remote, flags)
	sent := time.Now() // a hold in the answer counts from here (holdPeer)
	a, res, err := ask(ctx, d, v, d.cfg.claimTO, &fm, w.ch)
	dropWait(&t.mu, t.waits, tok)
	if res != askAnswered || err != nil {
		// A direct answer that came as we gave up is in w.ch (the rx
		// loop sends under t.mu): abort it, or its acceptor would
		// wait for a COMMIT that never comes.
		select {
		case late := <-w.ch:
			if late.status == statusDirectAns {
				d.commit(v, peer, late.token, remote.Port(), 0)
			}
		default:
		}
	}
	switch {
	case err != nil:
		return 0, false, nil, err
	case res == askUnsent:
		return FallbackNoListener, false, nil, nil // no exnd there, peer down: nothing listens
	case res == askTimeout:
		return FallbackNoClaim, false, nil, nil
	case a.status == statusDirectAns && w.direct:
		di, why, err := d.clientDirectClaim(ctx, v, peer, remote.Port(), a, open)
		return why, di != nil, di, err
	case a.status == 1:
		return 0, true, nil, nil
	case a.reason == declineNoListener:
		return FallbackNoListener, false, nil, nil
	}
	if left, ok := holdOf(a.reason); ok {
		d.holdPeer(remote, left, sent)
		return FallbackShortLived, false, nil, nil
	}
	return FallbackDeclined, false, nil, nil
}

// WithClaimTimeout bounds the client's wait for the server's agreement
// (default DefaultClaimTimeout).
func WithClaimTimeout(dur time.Duration) Option { return func(c *config) { c.claimTO = dur } }

// DefaultHandshakeTimeout is the default bound on the shadow handshake
// (WithHandshakeTimeout); an acceptor whose claim was agreed waits this
// long for the client's hello.
const DefaultHandshakeTimeout = time.Second

// OnFabric reports whether ip resolves to a fabric node other than this
// one (a client there may offer a claim; any other client cannot).
func (d *Device) OnFabric(ip netip.Addr) bool {
	if d.cfg.resolver == nil {
		return false
	}
	_, ok := d.cfg.resolver.Resolve(ip.Unmap())
	return ok
}

// claimListening reports whether port has a claim registration.
func (d *Device) claimListening(port uint16) bool {
	d.claims.mu.Lock()
	defer d.claims.mu.Unlock()
	return d.claims.ports[port] > 0
}
