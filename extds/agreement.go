package extds

// The out-of-band agreement between Devices (claims, direct agreements,
// listener probes, holds) lives in package internal/agree: one Agent per
// Device, which sees the Device only through agreeHost below. This file
// is the Device's side of it: the exported methods, which hand each call
// to the Agent, the Claim type, and agreeHost. The Device's rx loop hands
// the Agent its messages (dispatch), its tick runs Agent.Sweep, and its
// Stats include the Agent's.
//
// Locks: none of its own. agreeHost's Open, Closed and Send take
// Device.mu (a read lock, or vdev's), which the Agent never holds one of
// its own locks across; Queue takes none (the Agent calls it under its
// claim lock). No Device lock is held while calling into the Agent.

import (
	"context"
	"net"
	"net/netip"
	"time"

	"github.com/exn-project/exn/extds/internal/agree"
	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// TupleKey is a TCP connection as the server sees it: its local
// (listening) address and the client's address.
type TupleKey = agree.TupleKey

const (
	// DefaultClaimTimeout bounds the client's wait for the server's
	// agreement: the accepting process must call accept within it. A
	// registered listener whose acceptor never claims (no shim, no exnd
	// access, EXTDS_MODE=off) costs a client this once, then the address
	// is cached as TCP for a minute (negativeTTL).
	DefaultClaimTimeout = agree.DefaultClaimTimeout
	// MaxHold is the longest hold the wire can say (HoldPort clamps).
	MaxHold = wire.MaxHold
	// HoldMargin is how much earlier than the server's exnd every other
	// party ends a hold: far more than a control round trip or a fabric
	// one-way trip (tens to hundreds of microseconds, docs/wakeup.md),
	// and short against a hold, so little of it is lost.
	HoldMargin = agree.HoldMargin
	// UpgradeClaimTimeout bounds an upgrade's wait for the other side's
	// agreement (OfferDirect, and the acceptor's wait in the shim server).
	UpgradeClaimTimeout = agree.UpgradeClaimTimeout
)

// agreeHost is the Device as its Agent sees it (agree.Host).
type agreeHost Device

func (h *agreeHost) Open(v int) error {
	_, err := (*Device)(h).vdev(v)
	return err
}

func (h *agreeHost) Closed() bool {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.closed
}

func (h *agreeHost) Send(ctx context.Context, v int, fm *[1]fabric.Message) error {
	vd, err := (*Device)(h).vdev(v)
	if err != nil {
		return err
	}
	_, err = vd.ep.Send(ctx, fm[:])
	return err
}

func (h *agreeHost) Queue(v int, c wire.Ctl) { (*Device)(h).queueCtl(ctrlReq{vd: v, ctl: c}) }

func (h *agreeHost) Warn(msg string, args ...any) { h.rlog.warn(msg, args...) }

// newAgent makes d's Agent; d.cfg and d.ctx are set.
func (d *Device) newAgent() *agree.Agent {
	pbase := d.cfg.probeBase
	if pbase == 0 {
		pbase = d.cfg.base
	}
	return agree.New((*agreeHost)(d), agree.Config{
		Resolver: d.cfg.resolver, ProbeBase: pbase,
		ProbeTimeout: d.cfg.probeTO, ClaimTimeout: d.cfg.claimTO, HandshakeTimeout: d.cfg.handshakeTO,
		SendTimeout: ctrlSendTimeout, NegativeTTL: d.cfg.negativeTTL, PortHook: d.cfg.portHook,
	}, d.ctx)
}

// offerFallback is the fallback reason of each answer to a client's
// claim (Agent.Offer) that is not agreement.
var offerFallback = [...]FallbackReason{
	agree.NoListener:  FallbackNoListener,
	agree.NoClaim:     FallbackNoClaim,
	agree.Declined:    FallbackDeclined,
	agree.ShortLived:  FallbackShortLived,
	agree.DirectAbort: FallbackDirectAbort,
}

// RegisterPort says an EXT-DS listener for TCP port is served on this
// node, so a peer's probe for it is answered "yes" (Listen and NewListener
// do this themselves; exnd's shim server calls it for shimmed apps). It
// opens the port's vdev, which must be open to receive probes and
// connections. Registrations are counted: the port is unlisted when every
// registration's unregister has run. unregister is idempotent.
func (d *Device) RegisterPort(port uint16) (unregister func(), err error) {
	return d.agree.RegisterPort(port)
}

// Listening reports whether port is registered (RegisterPort).
func (d *Device) Listening(port uint16) bool { return d.agree.Listening(port) }

// Probe asks node's Device whether an EXT-DS listener is registered for
// TCP port. It sends one PROBE from the vdev of localPort (the prober's
// side of the shadow connection) to VPID base + (port & 0xF) on node —
// the prober's own base, or, in a process attached through exnd
// (AttachDevice), exnd's block, which answers for the node's attached
// listeners too — and waits at most the probe timeout;
// a node whose vdev for port is not open, or no answer in time, is
// "no". The error is non-nil only when ctx ends or the Device is closed.
func (d *Device) Probe(ctx context.Context, node fabric.NodeID, localPort, port uint16) (bool, error) {
	return d.agree.Probe(ctx, node, localPort, port)
}

// RegisterClaimPort says a listener on TCP port is served on this node
// by processes that claim each accepted socket (Device.Claim): a peer's
// CLAIM for a connection to port is agreed only once its acceptor
// claimed it, and a connection nobody claims stays plain TCP with
// nothing written into it. It opens the port's vdev. unregister is
// idempotent; registrations are counted.
func (d *Device) RegisterClaimPort(port uint16) (unregister func(), err error) {
	return d.agree.RegisterClaimPort(port)
}

// OnFabric reports whether ip resolves to a fabric node other than this
// one (a client there may offer a claim; any other client cannot).
func (d *Device) OnFabric(ip netip.Addr) bool {
	if d.cfg.resolver == nil {
		return false
	}
	_, ok := d.cfg.resolver.Resolve(ip.Unmap())
	return ok
}

// Claim is an acceptor's claim on one accepted connection (Device.Claim).
type Claim struct {
	d *Device
	c agree.Claim
}

// Claim says the caller accepted the TCP connection key and will read an
// EXT-DS hello on it if the client sends one: the client's CLAIM (now or
// when it arrives) is agreed. The caller must Close the claim once it
// decided the connection's mode.
func (d *Device) Claim(key TupleKey) *Claim { return &Claim{d, d.agree.Claim(key, nil)} }

// DeclineClaim settles the accepted TCP connection key as plain TCP
// without claiming it: its client's CLAIM, now or later, is declined at
// once and the client stays TCP with nothing written. For an acceptor
// that cannot take EXT-DS (the shim short of descriptors).
func (d *Device) DeclineClaim(key TupleKey) { d.agree.Decline(key) }

// ClaimDirect is Claim for an acceptor that makes direct connections: a
// CLAIM that offers one is not agreed by the rx loop but recorded, and
// wake is called (from the rx loop, without locks held; it must not
// block) so that the acceptor, which may be waiting for the shadow
// connection's first bytes, looks at DirectPending and calls AgreeDirect.
// A CLAIM that does not offer one is agreed as by Claim.
func (d *Device) ClaimDirect(key TupleKey, wake func()) *Claim {
	return &Claim{d, d.agree.Claim(key, wake)}
}

// Agreed reports whether the client was told to go ahead (it will send
// an EXT-DS hello unless it gave up first).
func (c *Claim) Agreed() bool { return c.c.Agreed() }

// Close ends the claim and reports whether it was agreed. A claim not
// agreed becomes a tombstone: a CLAIM arriving later is declined. It is
// idempotent.
func (c *Claim) Close() (agreed bool) { return c.c.Close() }

// Held reports whether the client's CLAIM for this connection was
// declined because the port is on hold: the client sends no hello.
func (c *Claim) Held() bool { return c.c.Held() }

// DirectPending reports whether a direct CLAIM is waiting for AgreeDirect.
func (c *Claim) DirectPending() bool { return c.c.DirectPending() }

// AgreeDirect answers a pending direct CLAIM (DirectPending): create makes
// the buffer, CLAIM_DIRECT names it, and the client's COMMIT decides. The
// results, one of:
//   - (nil, info, nil): the client committed; the connection is direct
//     and shadow is the caller's (nothing was written into it);
//   - (c, nil, nil): the client aborted; c is shadow as plain TCP
//     (counted as FallbackDirectAbort);
//   - (nil, nil, nil): create failed and the client was told to go ahead
//     the ordinary way: its hello (a direct offer) comes over shadow;
//   - an error: no COMMIT in the handshake timeout, the answer could not
//     be sent, ctx ended or the Device closed. The caller fails the
//     connection and resets what create made.
//
// prepare, when not nil, runs once CLAIM_DIRECT is on its way, before
// the wait for COMMIT: the caller readies what the program will get
// while the client opens the buffer (it must undo that unless the result
// is a DirectInfo). The caller owns what create made, whatever the
// outcome.
func (c *Claim) AgreeDirect(ctx context.Context, shadow net.Conn, create func() (DirectInfo, error), prepare func(DirectInfo)) (*Conn, *DirectInfo, error) {
	di, aborted, err := c.c.AgreeDirect(ctx, create, prepare)
	if aborted {
		return c.d.fallback(shadow, nil, FallbackDirectAbort), nil, nil
	}
	return nil, di, err
}

// AgreeUpgrade is AgreeDirect for a connection that stays the program's
// while it is agreed (the shim's mid-stream upgrade, docs/shim.md
// "Upgrade"): there is no shadow to fall back on, so the results are
// (info, false, nil) when the client committed, (nil, true, nil) when it
// aborted, (nil, false, nil) when create failed (the client was told to
// go ahead the ordinary way and sends nothing: its upgrade asks for
// direct only), or an error as AgreeDirect's.
func (c *Claim) AgreeUpgrade(ctx context.Context, create func() (DirectInfo, error), prepare func(DirectInfo)) (*DirectInfo, bool, error) {
	return c.c.AgreeDirect(ctx, create, prepare)
}

// OfferDirect asks for a direct connection for the established TCP
// connection local→remote (the client's view) out of band, for a
// connection that stays the program's while it is agreed (the shim's
// mid-stream upgrade, docs/shim.md "Upgrade"): nothing is read from or
// written into it, and no answer is cached for the server's address. It
// returns the DirectInfo once open succeeded and the client committed,
// or the fallback reason with nil; an error only when ctx ended, the
// Device closed, or a COMMIT could not be sent (agree.ErrCommitUnsent).
func (d *Device) OfferDirect(ctx context.Context, local, remote netip.AddrPort, open func(*DirectInfo) error) (*DirectInfo, FallbackReason, error) {
	if d.cfg.resolver == nil {
		return nil, FallbackNoRoute, nil
	}
	node, ok := d.cfg.resolver.Resolve(remote.Addr().Unmap())
	if !ok {
		return nil, FallbackNoRoute, nil
	}
	ans, di, err := d.agree.OfferUpgrade(ctx, node, local, remote, open)
	switch {
	case err != nil:
		return nil, 0, err
	case ans == agree.Direct:
		return di, 0, nil
	case ans == agree.Agreed:
		// The acceptor claimed the connection without a direct buffer:
		// it takes it as TCP too, and nothing is written.
		return nil, FallbackDeclined, nil
	}
	return nil, offerFallback[ans], nil
}

// HoldPort puts the listener port on hold for dur (at most MaxHold; 0 or
// less ends a hold): the short-lived connections' holds of
// internal/agree/hold.go, which has the whole story. Safe for concurrent
// use.
func (d *Device) HoldPort(port uint16, dur time.Duration) { d.agree.HoldPort(port, dur) }

// SkippedByHold reports whether the accepted connection key, made at
// made, was made while a client skipped asking because its port was on
// hold: inside the port's latest hold, and before the clients' window
// of it ended (2·HoldMargin and a slack for the kernel's jiffies before
// its end). Such a client sends no CLAIM and no hello, so the acceptor
// takes the connection as TCP at once (AcceptHeld) instead of waiting
// for them. It reports false if a CLAIM or a tombstone for key is known
// (Claim decides those). When it reports true, a CLAIM for key that
// still comes (its client did not skip after all) is declined as held,
// so that the client goes plain TCP too and nothing is written into the
// stream.
func (d *Device) SkippedByHold(key TupleKey, made time.Time) bool {
	return d.agree.SkippedByHold(key, made)
}

// PortHold returns how long port stays on hold for this node's acceptors:
// the remaining hold minus HoldMargin, 0 if none.
func (d *Device) PortHold(port uint16) time.Duration { return d.agree.PortHold(port) }

// AcceptOnHold is PortHold for the acceptor of the connection key: how
// long its port stays on hold for acceptors, 0 if it is not. When it is,
// the acceptor takes the connection as plain TCP without claiming it,
// so the connection's claim state is settled here: a CLAIM for key that
// comes later is declined as held whenever it comes, even after the
// hold. (One that came before the hold began was declined when it began,
// HoldPort; one that came during it, at once.) Safe for concurrent use.
func (d *Device) AcceptOnHold(key TupleKey) time.Duration { return d.agree.AcceptOnHold(key) }

// PeerHold returns how long connections to the server at addr stay
// plain TCP without asking (a hold its exnd announced), 0 if none.
func (d *Device) PeerHold(addr netip.AddrPort) time.Duration { return d.agree.PeerHold(addr) }

// AcceptHeld is AcceptShadow for a connection whose claim is Held: shadow
// as a ModeTCP Conn, counted as FallbackShortLived, nothing read.
func (d *Device) AcceptHeld(shadow net.Conn) *Conn {
	return d.fallback(shadow, nil, FallbackShortLived)
}

// Forgo tells the server's node that the client's connection
// local→remote stays plain TCP and no CLAIM or hello comes (the client's
// shim lacks descriptors): its acceptor answers at once instead of
// waiting the peek and claim timeouts. A server off the fabric is told
// nothing (its acceptor does not wait). Best effort; an error says the
// word could not be sent.
func (d *Device) Forgo(ctx context.Context, local, remote netip.AddrPort) error {
	if d.cfg.resolver == nil {
		return nil
	}
	node, ok := d.cfg.resolver.Resolve(remote.Addr().Unmap())
	if !ok {
		return nil
	}
	return d.agree.Forgo(ctx, node, local, remote)
}

// Forgone reports whether the client said this connection stays plain
// TCP (Forgo): no CLAIM and no hello come.
func (c *Claim) Forgone() bool { return c.c.Forgone() }

// WakeOnForgo has f called (without locks held; it must not block) if the
// client forgoes the connection while the caller waits. Look at Forgone
// after setting it.
func (c *Claim) WakeOnForgo(f func()) { c.c.WakeOnForgo(f) }

// AcceptForgone returns an accepted socket whose client forwent EXT-DS
// (Claim.Forgone) as a ModeTCP Conn, counted as FallbackPeerFDLimit,
// nothing read.
func (d *Device) AcceptForgone(shadow net.Conn) *Conn {
	return d.fallback(shadow, nil, FallbackPeerFDLimit)
}
