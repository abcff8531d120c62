package agree

// Out-of-band agreement (CLAIM / CLAIM_REPLY): nothing is written into a
// shadow TCP connection before both nodes agreed, over the fabric, that
// the process that accepted that very connection speaks EXT-DS. The
// server's agreement is keyed by the connection's TCP 4-tuple and given
// only when the accepting side claims the accepted socket (Claim, which
// exnd's shim server calls for a shimmed accept) — or at once for a
// port served by an in-process Listener, which always speaks EXT-DS. The
// state machine is in docs/extds.md ("Negotiation"); the messages'
// layout in wire/claim.go.
//
// A CLAIM's flags may offer a direct connection (claimdirect.go, which
// also has the direct answer and its COMMIT); a decline may carry a
// hold's remaining time (hold.go). Claims are matched by token, fabric
// source (which a sender cannot forge) and port; the server also checks
// that the client IP resolves to the CLAIM's source node.
//
// Locking: claimTable.mu guards its maps; it is a leaf lock (nothing is
// sent or waited for under it) but for pmu, taken under it to read the
// Listener ports. Replies go through the Host's control sender.

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// Limits, with why.
const (
	// DefaultClaimTimeout bounds the client's wait for the server's
	// agreement: the accepting process must call accept within it. A
	// registered listener whose acceptor never claims (no shim, no exnd
	// access, EXTDS_MODE=off) costs a client this once, then the address
	// is cached as TCP for a minute (NegativeTTL).
	DefaultClaimTimeout = 300 * time.Millisecond
	// claimTombstone keeps a claim the acceptor gave up on (it went plain
	// TCP) so that a late CLAIM is declined at once instead of waiting.
	claimTombstone = 5 * time.Second
	// maxClaims bounds the table (offers not yet claimed, claims not yet
	// offered, tombstones): a peer cannot make exnd keep unbounded state.
	// A full table declines ("busy").
	maxClaims = 8192
)

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
	stForgone                         // the client said it stays TCP (a CLAIM with ClaimFlagNone, Forgo): no CLAIM or hello comes
)

// tombstone reports whether st is kept only until it expires (Sweep) and
// a new CLAIM of an upgrade replaces it.
func (st claimState) tombstone() bool {
	return st == stOffered || st == stClosed || st == stHeld || st == stSkipped || st == stForgone
}

type claimEntry struct {
	st      claimState
	token   uint32
	from    fabric.Addr
	vd      int
	expires time.Time // stOffered, stClosed
	sport   uint16    // the server port (COMMIT's check)
	// Direct agreement (claimdirect.go).
	offerDirect bool           // the CLAIM offered a direct connection
	wake        func()         // ClaimDirect's hook (nil: Claim's acceptor, no direct)
	forgoWake   func()         // WakeOnForgo's hook: the client forwent (onForgo)
	commit      chan commitAns // cap 1, stReplied: COMMIT's status (COMMIT_R's client side)
	ck          commitKey      // stReplied: its key in the commit table
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
	vd     int
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

// RegisterClaimPort implements Device.RegisterClaimPort: it opens the
// port's vdev and counts the registration.
func (a *Agent) RegisterClaimPort(port uint16) (unregister func(), err error) {
	if err := a.host.Open(int(port & 0xF)); err != nil {
		return func() {}, err
	}
	if a.host.Closed() {
		return func() {}, net.ErrClosed
	}
	t := &a.claims
	t.mu.Lock()
	t.ports[port]++
	t.mu.Unlock()
	return uncount(&t.mu, t.ports, port, func() {}), nil
}

// Claim is an acceptor's claim on one accepted connection (Agent.Claim).
type Claim struct {
	a   *Agent
	key TupleKey
}

// Claim implements Device.Claim, and ClaimDirect when wake is not nil.
func (a *Agent) Claim(key TupleKey, wake func()) Claim {
	key = key.norm()
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	switch {
	case e != nil && (e.st == stHeld || e.st == stForgone):
		// Declined by a hold, or forgone by its client, before the
		// acceptor came: Held or Forgone reports it.
	case e != nil && e.st == stOffered && wake != nil && e.offerDirect:
		e.st, e.wake = stDirect, wake // DirectPending: the caller answers
	case e != nil && e.st == stOffered:
		e.st = stAgreed
		a.claimReply(e, key.Local.Port(), 1, 0)
	case e == nil && len(t.m) < maxClaims:
		t.m[key] = &claimEntry{st: stAccepting, wake: wake}
	case e == nil:
		// Full: no entry, so a CLAIM is declined (busy) and the
		// client stays TCP; Agreed reports false.
	default:
		// A stale tombstone of a reused 4-tuple.
		e.st, e.wake = stAccepting, wake
	}
	return Claim{a: a, key: key}
}

// Decline settles the accepted connection key as plain TCP without
// claiming it (an acceptor that cannot take EXT-DS, e.g. short of
// descriptors): a CLAIM that already came is declined now, one that
// comes later at once (a tombstone), so its client never waits out the
// claim timeout. Safe for concurrent use.
func (a *Agent) Decline(key TupleKey) {
	key = key.norm()
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[key]
	until := time.Now().Add(claimTombstone)
	switch {
	case e == nil && len(t.m) < maxClaims:
		t.m[key] = &claimEntry{st: stClosed, expires: until}
	case e == nil:
		// Full: a CLAIM is declined busy.
	case e.st == stOffered:
		a.claimReply(e, key.Local.Port(), 0, wire.DeclineLate)
		e.st, e.expires, e.wake = stClosed, until, nil
	case e.st == stAccepting:
		e.st, e.expires, e.wake = stClosed, until, nil
	}
	// Agreed or agreeing (a reused 4-tuple's claim in flight): that
	// acceptor's Close settles it.
}

// Agreed reports whether the client was told to go ahead.
func (c Claim) Agreed() bool { return c.state() == stAgreed }

// state is the claim's entry's state, 0 if it has none.
func (c Claim) state() claimState {
	t := &c.a.claims
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
func (c Claim) Close() (agreed bool) {
	t := &c.a.claims
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
	case e.st == stHeld, e.st == stForgone:
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
func (a *Agent) claimReply(e *claimEntry, port uint16, status, reason uint8) {
	a.host.Queue(e.vd, wire.Ctl{Peer: e.from, Conn: e.token, Tag: wire.TagClaimRep, Port: port, Status: status, Reason: reason})
}

// onClaim answers, or records, a peer's CLAIM (rx loop; never blocks).
func (a *Agent) onClaim(v int, from fabric.Addr, m *wire.Msg) {
	sport, cport, cip, sip, flags, ok := wire.DecodeClaim(m.Data)
	if !ok || int(sport&0xF) != v {
		a.drop("from", from, "why", "malformed claim or wrong vdev")
		return
	}
	a.ctr.probesServed.Add(1)
	offerDirect := flags&wire.ClaimFlagDirect != 0
	upgrade := flags&wire.ClaimFlagUpgrade != 0
	reply := &claimEntry{token: m.Conn, from: from, vd: v, sport: sport, offerDirect: offerDirect}
	forgo := flags == wire.ClaimFlagNone
	if res := a.cfg.Resolver; res != nil {
		if n, known := res.Resolve(cip); known && n != from.Node {
			if forgo {
				a.drop("from", from, "why", "forgo for an address of another node")
				return
			}
			a.claimReplyNow(reply, sport, 0, wire.DeclineMismatch)
			return
		}
	}
	key := TupleKey{netip.AddrPortFrom(sip, sport), netip.AddrPortFrom(cip, cport)}
	now := time.Now()
	if forgo {
		a.onForgo(key, now)
		return
	}
	skipped := a.AcceptedInHold(key, now) // before t.mu: a kernel lookup (hold.go)
	var wake func()
	defer func() {
		if wake != nil {
			wake() // after the unlock below (deferred later, run first)
		}
	}()
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ports[sport] == 0 {
		a.pmu.RLock()
		auto := a.ports[sport] > 0
		a.pmu.RUnlock()
		if auto {
			a.claimReply(reply, sport, 1, 0) // an in-process Listener: always EXT-DS
		} else {
			a.claimReply(reply, sport, 0, wire.DeclineNoListener)
		}
		return
	}
	e := t.m[key]
	if e == nil {
		if left := t.holdLeftLocked(sport, now); left > 0 || skipped {
			// On hold: the acceptors do not claim (hold.go). One
			// that does after all (its window ended) learns from the
			// entry that no hello comes (Claim.Held). After the hold,
			// its acceptor skipped asking (AcceptedInHold): nothing
			// left to cache.
			a.claimReply(reply, sport, 0, wire.HoldReason(left))
			if len(t.m) < maxClaims {
				reply.st, reply.expires = stHeld, now.Add(claimTombstone)
				t.m[key] = reply
			}
			return
		}
	}
	keep := 2 * DefaultClaimTimeout
	if upgrade {
		keep = 2 * UpgradeClaimTimeout
		if e != nil && e.st.tombstone() {
			// The client asked again (its earlier CLAIM timed out
			// unanswered, or an earlier attempt of either side
			// ended): the new one replaces whatever is left.
			delete(t.m, key)
			e = nil
		}
	}
	switch {
	case e == nil && len(t.m) >= maxClaims:
		a.claimReply(reply, sport, 0, wire.DeclineBusy)
	case e == nil:
		reply.st, reply.expires = stOffered, now.Add(keep)
		t.m[key] = reply
	case e.st == stAccepting && e.wake != nil && offerDirect:
		e.st, e.token, e.from, e.vd, e.sport, e.offerDirect = stDirect, m.Conn, from, v, sport, true
		wake = e.wake
	case e.st == stAccepting:
		e.st, e.token, e.from, e.vd, e.sport = stAgreed, m.Conn, from, v, sport
		a.claimReply(e, sport, 1, 0)
	case e.st == stClosed:
		a.claimReply(reply, sport, 0, wire.DeclineLate)
	case e.st == stSkipped:
		// Its acceptor took it as plain TCP because of a hold
		// (AcceptOnHold, SkippedByHold): declined as held, with what
		// is left of the hold (none once it is over) for the client
		// to cache.
		delete(t.m, key)
		a.claimReply(reply, sport, 0, wire.HoldReason(t.holdLeftLocked(sport, now)))
	default:
		a.drop("from", from, "why", "duplicate claim")
	}
}

// onForgo records a client's word that its connection key stays plain
// TCP (a CLAIM with ClaimFlagNone, Forgo): a tombstone that Claim.Forgone
// reports, so the acceptor takes the socket as TCP at once instead of
// waiting the peek and claim timeouts for a CLAIM or hello that never
// come; an acceptor already waiting is woken (WakeOnForgo). A full
// table keeps nothing: that acceptor waits, as before. Rx loop; never
// blocks.
func (a *Agent) onForgo(key TupleKey, now time.Time) {
	var wake func()
	t := &a.claims
	t.mu.Lock()
	switch e := t.m[key]; {
	case e == nil && len(t.m) < maxClaims:
		t.m[key] = &claimEntry{st: stForgone, expires: now.Add(claimTombstone)}
	case e != nil && e.st == stAccepting:
		wake = e.forgoWake
		e.st, e.expires, e.wake, e.forgoWake = stForgone, now.Add(claimTombstone), nil, nil
	}
	t.mu.Unlock()
	if wake != nil {
		wake()
	}
}

// WakeOnForgo has f called (from the rx loop, without locks held; it must
// not block) if the client forgoes the connection while its acceptor
// waits (Forgone then reports true), so that it stops its wait. The
// caller looks at Forgone after.
func (c Claim) WakeOnForgo(f func()) {
	t := &c.a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[c.key]; e != nil && e.st == stAccepting {
		e.forgoWake = f
	}
}

// forgoToken is a forgo's CLAIM token: nothing answers it, but the
// header's connection field may not be 0 (wire.Decode).
const forgoToken = ^uint32(0)

// Forgone reports whether the client said its connection stays plain
// TCP (Forgo): no CLAIM and no hello come.
func (c Claim) Forgone() bool { return c.state() == stForgone }

// Forgo tells node that the client's TCP connection local→remote (the
// client's view) stays plain TCP and sends no CLAIM or hello (its shim
// lacked the descriptors for EXT-DS): a CLAIM with ClaimFlagNone, not
// answered. Best effort: an error says it could not be sent (then the
// acceptor waits its timeouts, as it would have).
func (a *Agent) Forgo(ctx context.Context, node fabric.NodeID, local, remote netip.AddrPort) error {
	local, remote = normAP(local), normAP(remote)
	v, peer, err := a.askTarget(node, local.Port(), remote.Port())
	if err != nil {
		return err
	}
	var fm [1]fabric.Message
	wire.EncClaim(&fm[0], peer, forgoToken, local, remote, wire.ClaimFlagNone)
	return a.sendNow(ctx, v, &fm)
}

func (a *Agent) claimReplyNow(e *claimEntry, port uint16, status, reason uint8) {
	a.claims.mu.Lock()
	a.claimReply(e, port, status, reason)
	a.claims.mu.Unlock()
}

// answered says what became of an answer for a client's claim.
type answered uint8

const (
	ansTaken   answered = iota // the claim waiting for it has it
	ansNoClaim                 // no claim waits for it
	ansDup                     // the claim already has an answer
)

// answer hands ans to the client's claim that an answer from peer on
// vdev v for token and port belongs to; a direct answer only to a claim
// that offered one (rx loop; never blocks).
func (a *Agent) answer(v int, peer fabric.Addr, token uint32, port uint16, ans claimAns) answered {
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.waits[token]
	if w == nil || w.vd != v || w.peer != peer || w.port != port || ans.status == statusDirectAns && !w.direct {
		return ansNoClaim
	}
	select {
	case w.ch <- ans:
		return ansTaken
	default:
		return ansDup
	}
}

// onClaimReply hands an answer to the client waiting for it.
func (a *Agent) onClaimReply(v int, from fabric.Addr, m *wire.Msg) {
	port, _, ok := wire.StatusBody(m, wire.ClaimRepLen)
	if !ok {
		a.drop("from", from, "why", "malformed claim reply")
		return
	}
	switch a.answer(v, from, m.Conn, port, claimAns{status: m.Data[2], reason: m.Data[3]}) {
	case ansNoClaim:
		a.drop("from", from, "token", m.Conn, "why", "claim reply matches no claim")
	case ansDup:
		a.drop("from", from, "token", m.Conn, "why", "duplicate claim reply")
	}
}

// Sweep drops offers nobody claimed in time and old tombstones (the
// Device's housekeeping tick).
func (a *Agent) Sweep(now time.Time) {
	t := &a.claims
	t.mu.Lock()
	for k, e := range t.m {
		if e.st.tombstone() && now.After(e.expires) {
			delete(t.m, k)
		}
	}
	t.mu.Unlock()
}

// Answer is how an Offer ended without an error.
type Answer uint8

const (
	Agreed      Answer = iota + 1 // go ahead: the client's hello follows on the connection
	Direct                        // agreed and committed over the fabric: a DirectInfo (claimdirect.go)
	NoListener                    // nothing listens there (declined so, or the CLAIM could not be sent)
	NoClaim                       // no answer in time: no acceptor claimed the connection
	Declined                      // declined: the acceptor went TCP, the table is full, address mismatch
	ShortLived                    // declined: the port is on hold (hold.go)
	DirectAbort                   // a direct answer the client could not open: COMMIT aborted
)

// Offer asks node whether the acceptor of the TCP connection
// local→remote (the client's view) speaks EXT-DS, and waits at most the
// claim timeout. Its Answer says how it ended when nothing was written
// to the connection; an error only when ctx ended, the Device closed, or
// a direct connection could not be committed (ErrCommitUnsent). With
// open (the caller can take a direct connection) the CLAIM offers one,
// and an acceptor that makes one answers with its name: open is called
// and, when it succeeds, the result is Direct and its DirectInfo
// (claimdirect.go).
func (a *Agent) Offer(ctx context.Context, node fabric.NodeID, local, remote netip.AddrPort, open func(*DirectInfo) error) (Answer, *DirectInfo, error) {
	return a.offer(ctx, node, local, remote, open, 0, a.cfg.ClaimTimeout)
}

// UpgradeClaimTimeout is how long an upgrade's CLAIM waits for its
// acceptor (OfferUpgrade), and the server keeps it twice that. Nobody is
// held up by it (the connection is in use meanwhile), and the acceptor's
// side asks only at its program's next call after the connection's age
// passed the shim's UPG_AGE_NS, through an exnd that may be busy with
// that very connection's TCP (TestShimUpgrade under load: with the
// claim timeout's 300 ms, half the attempts timed out).
const UpgradeClaimTimeout = time.Second

// OfferUpgrade is Offer for an established connection that moves onto a
// direct one in the background (the shim's upgrade): the CLAIM carries
// ClaimFlagUpgrade, so the server keeps it for 2·UpgradeClaimTimeout and
// a later CLAIM of the same connection replaces it; it waits up to
// UpgradeClaimTimeout. open is required.
func (a *Agent) OfferUpgrade(ctx context.Context, node fabric.NodeID, local, remote netip.AddrPort, open func(*DirectInfo) error) (Answer, *DirectInfo, error) {
	return a.offer(ctx, node, local, remote, open, wire.ClaimFlagUpgrade, UpgradeClaimTimeout)
}

func (a *Agent) offer(ctx context.Context, node fabric.NodeID, local, remote netip.AddrPort, open func(*DirectInfo) error, xflags uint32, wait time.Duration) (Answer, *DirectInfo, error) {
	local, remote = normAP(local), normAP(remote)
	v, peer, err := a.askTarget(node, local.Port(), remote.Port())
	if err != nil {
		return 0, nil, err
	}
	w := &claimWait{vd: v, peer: peer, port: remote.Port(), direct: open != nil, ch: make(chan claimAns, 1)}
	t := &a.claims
	t.mu.Lock()
	tok := FreeID(&t.nextTk, t.waits)
	t.waits[tok] = w
	t.mu.Unlock()
	flags := xflags
	if w.direct {
		flags |= wire.ClaimFlagDirect
	}
	var fm [1]fabric.Message
	wire.EncClaim(&fm[0], peer, tok, local, remote, flags)
	sent := time.Now() // a hold in the answer counts from here (holdPeer)
	ans, res, err := ask(ctx, a, v, wait, &fm, w.ch)
	dropWait(&t.mu, t.waits, tok)
	if res != askAnswered || err != nil {
		// A direct answer that came as we gave up is in w.ch (the rx
		// loop sends under t.mu): abort it, or its acceptor would
		// wait for a COMMIT that never comes.
		select {
		case late := <-w.ch:
			if late.status == statusDirectAns {
				a.commit(v, peer, late.token, remote.Port(), 0)
			}
		default:
		}
	}
	switch {
	case err != nil:
		return 0, nil, err
	case res == askUnsent:
		return NoListener, nil, nil // no exnd there, peer down: nothing listens
	case res == askTimeout:
		return NoClaim, nil, nil
	case ans.status == statusDirectAns && w.direct:
		return a.clientDirectClaim(ctx, v, peer, remote.Port(), ans, open)
	case ans.status == 1:
		return Agreed, nil, nil
	case ans.reason == wire.DeclineNoListener:
		return NoListener, nil, nil
	}
	if left, ok := wire.HoldOf(ans.reason); ok {
		a.holdPeer(remote, left, sent)
		return ShortLived, nil, nil
	}
	return Declined, nil, nil
}

// claimListening reports whether port has a claim registration.
func (a *Agent) claimListening(port uint16) bool {
	a.claims.mu.Lock()
	defer a.claims.mu.Unlock()
	return a.claims.ports[port] > 0
}
