package agree

// Holds for short-lived connections (issue #15; docs/extds.md, "Short
// connections"). Setting up an EXT-DS connection costs the two exnds
// and both programs about a millisecond (docs/shim.md, "Where TCP_CRR's
// time goes"); a connection that closes within a few milliseconds of
// that loses more than it gains. The accepting node's shim server
// (extds/shimsrv/hold.go) learns which listener ports serve such
// connections and puts a port on hold (HoldPort). While a port is held:
//
//   - a CLAIM for it that no acceptor claimed is declined at once, and the
//     decline carries the hold's remaining time: CLAIM_REPLY's reason
//     byte is DeclineHold | q, q the remaining time in HoldQuantum units
//     (rounded down; 0: too little left to cache);
//   - the client's Device keeps the server address as held for that time
//     minus 2·HoldMargin, counted from when it sent the CLAIM (holdPeer):
//     its connections to that address fall
//     back (FallbackShortLived) without a CLAIM, and a shim asking its
//     exnd is told how long to skip asking (PeerHold);
//   - the accepting shims are told the port's remaining time minus
//     HoldMargin (PortHold) and skip asking meanwhile.
//
// The windows are staggered: a client's ends 2·HoldMargin before the
// server's exnd stops declining, the acceptors' HoldMargin before, so no
// acceptor claims and waits for the hello of a client that still skips,
// and no acceptor skips while a client offers and waits for it. A client
// whose CLAIM was declined by a hold leaves a tombstone (stHeld): an
// acceptor that claims that connection after all is told at once that
// no hello comes (Claim.Held). A held connection is ordinary TCP:
// nothing is written into it.
//
// The stagger assumes an acceptor asks about a connection soon after the
// client made it. A server whose accept queue backs up (a loaded host)
// accepts after its own window connections that a client made, without
// a CLAIM, inside the client's: waiting for their CLAIM would cost the
// claim and peek timeouts each, serially in a one-thread server, and the
// next client's CLAIM would then time out (no_claim, and its negative
// cache). So the port's latest hold is kept after it ends (spans), and
// an acceptor asks SkippedByHold with the connection's age first.
//
// The stagger also assumes a CLAIM arrives within the margins. A CLAIM
// from a client that did not know the hold, slower than that (a loaded
// host), can arrive after the hold ended for a connection whose acceptor
// skipped asking: nobody would ever claim it. onClaim therefore asks the
// kernel about a CLAIM's connection that no acceptor asked about, after
// a hold (AcceptedInHold): accepted already and made inside the
// acceptors' window, it is declined as held. A CLAIM offered before a
// hold began is declined when it begins (HoldPort), as its acceptor may
// now skip asking.
//
// Locks: holds live in claimTable (t.mu, a leaf lock); the client's
// window cache under negMu (a leaf lock), as the negative cache.
// The encoding of a hold's time in CLAIM_REPLY is wire's (HoldReason).

import (
	"net/netip"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/internal/sys"
)

const (
	// HoldMargin is how much earlier than the server's exnd every other
	// party ends a hold: far more than a control round trip or a fabric
	// one-way trip (tens to hundreds of microseconds, docs/wakeup.md),
	// and short against a hold, so little of it is lost.
	HoldMargin = 10 * time.Millisecond
	// maxHeldPeers bounds the client's cache; a full cache is cleared
	// (its entries only save questions).
	maxHeldPeers = 4096
	// SkipSlack is how much earlier than a client's window ends a
	// connection must have been made to count as skipped
	// (SkippedByHold): the age the kernel gives is in jiffies (4 ms at
	// 250 Hz).
	SkipSlack = 5 * time.Millisecond
)

// holdSpan is a port's latest hold: when it began and when it ends. The
// port is on hold while end is ahead; the span stays after that, for
// SkippedByHold.
type holdSpan struct{ start, end time.Time }

// HoldPort implements Device.HoldPort: port on hold for dur, at most
// wire.MaxHold; 0 or less ends a hold.
func (a *Agent) HoldPort(port uint16, dur time.Duration) {
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if dur <= 0 {
		if sp, ok := t.spans[port]; ok && sp.end.After(now) {
			sp.end = now
			t.spans[port] = sp
		}
		return
	}
	if len(t.spans) >= maxClaims {
		clear(t.spans)
	}
	sp := holdSpan{start: now, end: now.Add(min(dur, wire.MaxHold))}
	t.spans[port] = sp
	// CLAIMs offered before the hold and not yet claimed: their
	// acceptors may now skip asking (a shim learns the hold from another
	// connection's answer), so they are declined as held here rather
	// than left to time out (no_claim). An acceptor that asks after all
	// finds the tombstone (AcceptOnHold, Claim.Held): TCP on both sides.
	for _, e := range t.m {
		if e.st == stOffered && e.sport == port {
			a.claimReply(e, port, 0, wire.HoldReason(sp.end.Sub(now)))
			e.st, e.expires = stHeld, now.Add(claimTombstone)
		}
	}
}

// SkippedByHold implements Device.SkippedByHold: whether key, made at
// made, was made inside the port's latest hold and before the clients'
// window of it ended (2·HoldMargin and SkipSlack before its end), with
// no CLAIM or tombstone known for it. When it reports true, a CLAIM for
// key that still comes is declined as held.
func (a *Agent) SkippedByHold(key TupleKey, made time.Time) bool {
	key = key.norm()
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	sp, ok := t.spans[key.Local.Port()]
	if !ok || t.m[key] != nil || made.Before(sp.start) || made.After(sp.end.Add(-2*HoldMargin-SkipSlack)) {
		return false
	}
	t.skipLocked(key, time.Now())
	return true
}

// PortHold implements Device.PortHold: the remaining hold of port minus
// HoldMargin, 0 if none.
func (a *Agent) PortHold(port uint16) time.Duration {
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(t.holdLeftLocked(port, time.Now())-HoldMargin, 0)
}

// AcceptOnHold implements Device.AcceptOnHold: PortHold for the acceptor
// of key, which, when it is on hold, settles key's claim state so that
// a later CLAIM for it is declined as held.
func (a *Agent) AcceptOnHold(key TupleKey) time.Duration {
	key = key.norm()
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	left := t.holdLeftLocked(key.Local.Port(), now)
	if left <= HoldMargin {
		return 0
	}
	if t.m[key] == nil {
		t.skipLocked(key, now)
	}
	return left - HoldMargin
}

// AcceptedInHold reports whether the connection key, whose CLAIM just
// arrived after its port's latest hold ended and which no acceptor asked
// about, may have been taken as plain TCP by an acceptor that skipped
// asking during the hold: the kernel (sock_diag, in this process's
// network namespace) says it was accepted already, and made before the
// acceptors' window ended (HoldMargin before the hold, SkipSlack for the
// age's jiffies). Its CLAIM then took longer than the margin to arrive
// (a loaded host; CI met it once) and is declined as held, with nothing
// to cache; waiting would end in the client's no_claim and its negative
// cache. An acceptor whose ask was merely behind the CLAIM finds the
// tombstone (Claim.Held): TCP on both sides either way. It does not
// look while the hold lasts (onClaim declines at once) or once the hold
// ended claimTombstone ago; any doubt (no answer, no such socket, not
// accepted yet) is false, and the CLAIM waits for its acceptor as any
// other. Called by the rx loop without t.mu: the lookup is one netlink
// round trip of kernel work, never a wait.
func (a *Agent) AcceptedInHold(key TupleKey, now time.Time) bool {
	t := &a.claims
	t.mu.Lock()
	sp, ok := t.spans[key.Local.Port()]
	known := t.m[key] != nil
	t.mu.Unlock()
	if !ok || known || now.Before(sp.end) || now.Sub(sp.end) > claimTombstone {
		return false
	}
	info, found, err := sys.LookupTCP(key.Local, key.Remote)
	if err != nil {
		a.host.Warn("extds: cannot look up a claimed connection", "local", key.Local, "remote", key.Remote, "err", err)
		return false
	}
	return found && info.Accepted && now.Add(-info.SinceLastAck).Before(sp.end.Add(-HoldMargin+SkipSlack))
}

// skipLocked records that key's acceptor took it as plain TCP because of
// a hold, so that a CLAIM for it is declined as held (onClaim); t.mu
// held. A full table records nothing: the CLAIM then meets the hold
// itself, or times out.
func (t *claimTable) skipLocked(key TupleKey, now time.Time) {
	if len(t.m) < maxClaims {
		t.m[key] = &claimEntry{st: stSkipped, expires: now.Add(claimTombstone)}
	}
}

// holdLeftLocked is the remaining hold of port (t.mu held).
func (t *claimTable) holdLeftLocked(port uint16, now time.Time) time.Duration {
	if sp, ok := t.spans[port]; ok && sp.end.After(now) {
		return sp.end.Sub(now)
	}
	return 0
}

// heldPeers maps a server to the end of its hold, as the client's Device
// knows it (under negMu).
type heldPeers map[netip.AddrPort]time.Time

// holdPeer keeps the server at addr as held for left minus twice
// HoldMargin: a client's window ends a margin before the server's
// acceptors' (PortHold), so that no acceptor, its window over, claims
// and waits for the hello of a client that still skips asking. left is
// what the server had left when it answered the CLAIM sent at sent, so
// the window counts from sent: the server answered after it, and however
// late the answer arrives or is read (a loaded host), the client's window
// cannot outlast the server's.
func (a *Agent) holdPeer(addr netip.AddrPort, left time.Duration, sent time.Time) {
	end := sent.Add(left - 2*HoldMargin)
	if !end.After(time.Now()) {
		return
	}
	a.negMu.Lock()
	defer a.negMu.Unlock()
	if len(a.held) >= maxHeldPeers {
		clear(a.held)
	}
	a.held[normAP(addr)] = end
}

// PeerHold implements Device.PeerHold: how long connections to the
// server at addr stay plain TCP without asking, 0 if none.
func (a *Agent) PeerHold(addr netip.AddrPort) time.Duration {
	a.negMu.Lock()
	defer a.negMu.Unlock()
	return timeLeft(a.held, normAP(addr), time.Now())
}

// Held reports whether the client's CLAIM for this connection was
// declined because the port is on hold: the client sends no hello.
func (c Claim) Held() bool { return c.state() == stHeld }
