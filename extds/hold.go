package extds

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
//     byte is declineHold | q, q the remaining time in holdQuantum units
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
// a hold (acceptedInHold): accepted already and made inside the
// acceptors' window, it is declined as held. A CLAIM offered before a
// hold began is declined when it begins (HoldPort), as its acceptor may
// now skip asking.
//
// Locks: holds live in claimTable (t.mu, a leaf lock); the client's
// window cache under negMu (a leaf lock), as the negative cache.

import (
	"net"
	"net/netip"
	"time"

	"github.com/exn-project/exn/internal/sys"
)

const (
	// holdQuantum is the unit of a hold's remaining time on the wire;
	// with 7 bits, MaxHold.
	holdQuantum = 16 * time.Millisecond
	// declineHold marks CLAIM_REPLY's reason byte as a hold (low 7 bits:
	// quanta left). Reasons below 0x80 are the other declines.
	declineHold uint8 = 0x80
	// MaxHold is the longest hold the wire can say (HoldPort clamps).
	MaxHold = 127 * holdQuantum
	// HoldMargin is how much earlier than the server's exnd every other
	// party ends a hold: far more than a control round trip or a fabric
	// one-way trip (tens to hundreds of microseconds, docs/wakeup.md),
	// and short against a hold, so little of it is lost.
	HoldMargin = 10 * time.Millisecond
	// maxHeldPeers bounds the client's cache; a full cache is cleared
	// (its entries only save questions).
	maxHeldPeers = 4096
	// skipSlack is how much earlier than a client's window ends a
	// connection must have been made to count as skipped
	// (SkippedByHold): the age the kernel gives is in jiffies (4 ms at
	// 250 Hz).
	skipSlack = 5 * time.Millisecond
)

// holdSpan is a port's latest hold: when it began and when it ends. The
// port is on hold while end is ahead; the span stays after that, for
// SkippedByHold.
type holdSpan struct{ start, end time.Time }

// HoldPort puts the listener port on hold for d (at most MaxHold; 0 or
// less ends a hold). See the file comment. Safe for concurrent use.
func (d *Device) HoldPort(port uint16, dur time.Duration) {
	t := &d.claims
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
	sp := holdSpan{start: now, end: now.Add(min(dur, MaxHold))}
	t.spans[port] = sp
	// CLAIMs offered before the hold and not yet claimed: their
	// acceptors may now skip asking (a shim learns the hold from another
	// connection's answer), so they are declined as held here rather
	// than left to time out (no_claim). An acceptor that asks after all
	// finds the tombstone (AcceptOnHold, Claim.Held): TCP on both sides.
	for _, e := range t.m {
		if e.st == stOffered && e.sport == port {
			d.claimReply(e, port, 0, holdReason(sp.end.Sub(now)))
			e.st, e.expires = stHeld, now.Add(claimTombstone)
		}
	}
}

// SkippedByHold reports whether the accepted connection key, made at
// made, was made while a client skipped asking because its port was on
// hold: inside the port's latest hold, and before the clients' window
// of it ended (2·HoldMargin and skipSlack before its end). Such a
// client sends no CLAIM and no hello, so the acceptor takes the
// connection as TCP at once (AcceptHeld) instead of waiting for them.
// It reports false if a CLAIM or a tombstone for key is known (Claim
// decides those). When it reports true, a CLAIM for key that still comes
// (its client did not skip after all) is declined as held, so that the
// client goes plain TCP too and nothing is written into the stream.
func (d *Device) SkippedByHold(key TupleKey, made time.Time) bool {
	key = TupleKey{normAP(key.Local), normAP(key.Remote)}
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	sp, ok := t.spans[key.Local.Port()]
	if !ok || t.m[key] != nil || made.Before(sp.start) || made.After(sp.end.Add(-2*HoldMargin-skipSlack)) {
		return false
	}
	t.skipLocked(key, time.Now())
	return true
}

// PortHold returns how long port stays on hold for this node's acceptors:
// the remaining hold minus HoldMargin, 0 if none.
func (d *Device) PortHold(port uint16) time.Duration {
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	return max(t.holdLeftLocked(port, time.Now())-HoldMargin, 0)
}

// AcceptOnHold is PortHold for the acceptor of the connection key: how
// long its port stays on hold for acceptors, 0 if it is not. When it is,
// the acceptor takes the connection as plain TCP without claiming it,
// so the connection's claim state is settled here: a CLAIM for key that
// comes later is declined as held whenever it comes, even after the
// hold. (One that came before the hold began was declined when it began,
// HoldPort; one that came during it, at once, onClaim.) Safe for
// concurrent use.
func (d *Device) AcceptOnHold(key TupleKey) time.Duration {
	key = TupleKey{normAP(key.Local), normAP(key.Remote)}
	t := &d.claims
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

// acceptedInHold reports whether the connection key, whose CLAIM just
// arrived after its port's latest hold ended and which no acceptor asked
// about, may have been taken as plain TCP by an acceptor that skipped
// asking during the hold: the kernel (sock_diag, in this process's
// network namespace) says it was accepted already, and made before the
// acceptors' window ended (HoldMargin before the hold, skipSlack for the
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
func (d *Device) acceptedInHold(key TupleKey, now time.Time) bool {
	t := &d.claims
	t.mu.Lock()
	sp, ok := t.spans[key.Local.Port()]
	known := t.m[key] != nil
	t.mu.Unlock()
	if !ok || known || now.Before(sp.end) || now.Sub(sp.end) > claimTombstone {
		return false
	}
	info, found, err := sys.LookupTCP(key.Local, key.Remote)
	if err != nil {
		d.rlog.warn("extds: cannot look up a claimed connection", "local", key.Local, "remote", key.Remote, "err", err)
		return false
	}
	return found && info.Accepted && now.Add(-info.SinceLastAck).Before(sp.end.Add(-HoldMargin+skipSlack))
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

// timeLeft is the time from now until m[k]; 0 if there is no entry, and
// an entry that has passed is deleted. The caller guards m.
func timeLeft[K comparable](m map[K]time.Time, k K, now time.Time) time.Duration {
	until, ok := m[k]
	if !ok {
		return 0
	}
	if left := until.Sub(now); left > 0 {
		return left
	}
	delete(m, k)
	return 0
}

// holdReason is CLAIM_REPLY's reason for a remaining hold.
func holdReason(left time.Duration) uint8 {
	return declineHold | uint8(min(left/holdQuantum, 127))
}

// holdOf decodes a CLAIM_REPLY reason: the hold's remaining time and
// whether the reason is a hold.
func holdOf(reason uint8) (time.Duration, bool) {
	if reason&declineHold == 0 {
		return 0, false
	}
	return time.Duration(reason&^declineHold) * holdQuantum, true
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
func (d *Device) holdPeer(addr netip.AddrPort, left time.Duration, sent time.Time) {
	end := sent.Add(left - 2*HoldMargin)
	if !end.After(time.Now()) {
		return
	}
	d.negMu.Lock()
	defer d.negMu.Unlock()
	if len(d.held) >= maxHeldPeers {
		clear(d.held)
	}
	d.held[normAP(addr)] = end
}

// PeerHold returns how long connections to the server at addr stay
// plain TCP without asking (a hold its exnd announced), 0 if none.
func (d *Device) PeerHold(addr netip.AddrPort) time.Duration {
	d.negMu.Lock()
	defer d.negMu.Unlock()
	return timeLeft(d.held, normAP(addr), time.Now())
}

// Held reports whether the client's CLAIM for this connection was
// declined because the port is on hold: the client sends no hello.
func (c *Claim) Held() bool { return c.state() == stHeld }

// AcceptHeld is AcceptShadow for a connection whose claim is Held: shadow
// as a ModeTCP Conn, counted as FallbackShortLived, nothing read.
func (d *Device) AcceptHeld(shadow net.Conn) *Conn {
	return d.fallback(shadow, nil, FallbackShortLived)
}
