package agree

// Direct agreement over the fabric (issue #15). When the client can take
// a direct connection (docs/direct.md) and the acceptor makes them, the
// agreement rides on the CLAIM exchange instead of the shadow TCP
// connection, so that nothing but the kernel's TCP handshake crosses
// exn0 while a connection is set up:
//
//	client's exnd                                accepting exnd
//	CLAIM, flags = ClaimFlagDirect ────────────→ (acceptor called ClaimDirect)
//	                                             create(): the buffer
//	          ←───────────────────────────────── CLAIM_DIRECT: token, ID, ring
//	open(info)
//	COMMIT {token, 1} ─────────────────────────→ both return the DirectInfo
//	  or, if open fails, or the answer came
//	  after the client gave up: COMMIT {token, 0} → both stay plain TCP
//
// Across hosts (create's DirectInfo has Remote set: an exnd whose fabric
// is not shm, docs/direct.md "Across hosts") the answer is CLAIM_RDIRECT,
// which adds the acceptor's engine connection and buffer NLA; the
// client's open makes its own buffer and engine connection, and its
// COMMIT_R carries them back. An abort is the plain COMMIT {token, 0}
// either way; a plain COMMIT {token, 1} for a cross-host answer (or a
// COMMIT_R for a one-host one) is a protocol violation that fails the
// connection.
//
// Nothing is written into the shadow connection by either side, so an
// abort leaves both programs plain TCP streams, untouched. Once it sent
// COMMIT the client is direct; an accepting exnd that gets no COMMIT
// within the handshake timeout fails the connection (an error, so the
// caller resets what it made) rather than fall back, because the client
// may be direct by then. An acceptor whose create fails answers with an
// ordinary CLAIM_REPLY (agreed): the client then offers direct in the
// shadow handshake (extds/direct.go) and gets the relay. The messages'
// layout is in wire/claim.go.
//
// COMMIT is matched by (fabric source, token): a sender cannot forge the
// source, and the token is the accepting exnd's own.
//
// Locking: claimTable.mu as in claim.go (a leaf lock: channels are sent
// to without blocking under it; nothing waits under it). The acceptor's
// wake hook runs after the lock is released.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/exn-project/exn/extds/internal/wire"
	"github.com/exn-project/exn/fabric"
)

// statusDirectAns is the status a client's waiter gets for a
// CLAIM_DIRECT (CLAIM_REPLY's are 0 and 1).
const statusDirectAns uint8 = 2

// commitKey names a CLAIM_DIRECT the accepting side waits on.
type commitKey struct {
	from  fabric.Addr
	token uint32
}

// claimAns is what a client's claim waiter receives from the rx loop.
type claimAns struct {
	status, reason uint8 // 1 agreed, 0 declined (reason), statusDirectAns
	token, ring    uint32
	id             uint64
	remote         bool       // CLAIM_RDIRECT
	nla            fabric.NLA // CLAIM_RDIRECT: the acceptor's buffer
}

// commitAns is what an acceptor's AgreeDirect receives from the rx loop:
// COMMIT's status, and COMMIT_R's client side (remote set).
type commitAns struct {
	status uint8
	remote bool
	id     uint64
	nla    fabric.NLA
}

var (
	// ErrNoCommit: the acceptor's AgreeDirect got no COMMIT in time.
	ErrNoCommit = errors.New("extds: the client did not commit the direct connection in time")
	// ErrCommitUnsent: the client's COMMIT could not be sent (Offer).
	ErrCommitUnsent = errors.New("extds: cannot send COMMIT")
	// ErrCommitMismatch: a COMMIT of the other kind (one host, across
	// hosts) than the answer it commits to.
	ErrCommitMismatch = errors.New("extds: COMMIT does not match the direct answer's kind")
)

// DirectPending reports whether a direct CLAIM is waiting for AgreeDirect.
func (c Claim) DirectPending() bool {
	t := &c.a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[c.key]
	return e != nil && e.st == stDirect
}

// AgreeDirect implements Claim.AgreeDirect of package extds: create
// makes the buffer, CLAIM_DIRECT names it, and the client's COMMIT
// decides. The results, one of: the DirectInfo (the client committed);
// aborted (the client aborted: the caller takes the connection as plain
// TCP); nothing (create failed and the client was told to go ahead the
// ordinary way); an error (no COMMIT in the handshake timeout, the
// answer could not be sent, ctx ended or the Device closed).
func (c Claim) AgreeDirect(ctx context.Context, create func() (DirectInfo, error), prepare func(DirectInfo)) (di *DirectInfo, aborted bool, err error) {
	a, t := c.a, &c.a.claims
	t.mu.Lock()
	e := t.m[c.key]
	if e == nil || e.st != stDirect {
		t.mu.Unlock()
		return nil, false, errors.New("extds: no direct claim pending")
	}
	from, vd, ctok := e.from, e.vd, e.token
	t.mu.Unlock()

	made, err := create()
	t.mu.Lock()
	if t.m[c.key] != e || e.st != stDirect {
		t.mu.Unlock()
		return nil, false, errors.New("extds: direct claim ended while the buffer was made")
	}
	ck := commitKey{from, made.Token}
	if _, dup := t.commits[ck]; err == nil && dup {
		err = fmt.Errorf("token %#x in use", made.Token)
	}
	if err != nil {
		a.host.Warn("extds: cannot make a direct connection, using the relay", "err", err)
		e.st = stAgreed
		a.claimReply(e, c.key.Local.Port(), 1, 0)
		t.mu.Unlock()
		return nil, false, nil
	}
	e.st, e.commit, e.ck = stReplied, make(chan commitAns, 1), ck
	t.commits[ck] = e
	t.mu.Unlock()

	var fm [1]fabric.Message
	if made.Remote {
		wire.EncClaimRDirect(&fm[0], from, ctok, c.key.Local.Port(), made.Token, made.Ring, made.ID, made.NLA)
	} else {
		wire.EncClaimDirect(&fm[0], from, ctok, c.key.Local.Port(), made.Token, made.Ring, made.ID)
	}
	if err := a.sendNow(ctx, vd, &fm); err != nil {
		a.ctr.handshakeErr.Add(1)
		return nil, false, fmt.Errorf("send CLAIM_DIRECT: %w", err)
	}
	if prepare != nil {
		prepare(made)
	}
	timer := time.NewTimer(a.cfg.HandshakeTimeout)
	defer timer.Stop()
	select {
	case ans := <-e.commit:
		switch {
		case ans.status != 1:
			return nil, true, nil
		case ans.remote != made.Remote:
			a.ctr.handshakeErr.Add(1)
			return nil, false, ErrCommitMismatch
		}
		if made.Remote {
			made.ClientID, made.ClientNLA, made.ClientNode = ans.id, ans.nla, from.Node
		}
		a.ctr.directAgreed.Add(1)
		return &made, false, nil
	case <-timer.C:
		a.ctr.handshakeErr.Add(1)
		return nil, false, ErrNoCommit
	case <-ctx.Done():
		return nil, false, ctx.Err()
	case <-a.ctx.Done():
		return nil, false, net.ErrClosed
	}
}

// onClaimDirect hands a CLAIM_DIRECT to the client waiting for it, or
// aborts one nobody waits for (the client gave up and went TCP), so that
// the accepting exnd goes TCP too at once (rx loop; never blocks).
func (a *Agent) onClaimDirect(v int, from fabric.Addr, m *wire.Msg) {
	port, tok, ring, id, ok := wire.DecodeClaimDirect(m.Data)
	if !ok {
		a.drop("from", from, "why", "malformed direct claim answer")
		return
	}
	if a.answer(v, from, m.Conn, port, claimAns{status: statusDirectAns, token: tok, ring: ring, id: id}) == ansTaken {
		return
	}
	a.drop("from", from, "token", m.Conn, "why", "direct claim answer matches no waiting claim")
	a.commit(v, from, tok, port, 0)
}

// onClaimRDirect is onClaimDirect for a cross-host answer.
func (a *Agent) onClaimRDirect(v int, from fabric.Addr, m *wire.Msg) {
	port, tok, ring, id, nla, ok := wire.DecodeClaimRDirect(m.Data)
	if !ok {
		a.drop("from", from, "why", "malformed cross-host direct claim answer")
		return
	}
	if a.answer(v, from, m.Conn, port, claimAns{status: statusDirectAns, token: tok, ring: ring, id: id, remote: true, nla: nla}) == ansTaken {
		return
	}
	a.drop("from", from, "token", m.Conn, "why", "direct claim answer matches no waiting claim")
	a.commit(v, from, tok, port, 0)
}

// onCommit hands a COMMIT to the acceptor waiting for it (rx loop).
func (a *Agent) onCommit(v int, from fabric.Addr, m *wire.Msg) {
	port, status, ok := wire.StatusBody(m, wire.CommitLen)
	if !ok || m.Data[3] != 0 {
		a.drop("from", from, "why", "malformed commit")
		return
	}
	a.committed(v, from, m.Conn, port, commitAns{status: status})
}

// onCommitR hands a COMMIT_R to the acceptor waiting for it (rx loop).
func (a *Agent) onCommitR(v int, from fabric.Addr, m *wire.Msg) {
	port, id, nla, ok := wire.DecodeCommitR(m.Data)
	if !ok {
		a.drop("from", from, "why", "malformed cross-host commit")
		return
	}
	a.committed(v, from, m.Conn, port, commitAns{status: 1, remote: true, id: id, nla: nla})
}

// committed hands ans to the acceptor whose CLAIM_DIRECT (or
// CLAIM_RDIRECT) carried token (rx loop; never blocks).
func (a *Agent) committed(v int, from fabric.Addr, token uint32, port uint16, ans commitAns) {
	t := &a.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	k := commitKey{from, token}
	e := t.commits[k]
	if e == nil || e.vd != v || e.sport != port {
		a.drop("from", from, "token", token, "why", "commit matches no direct claim")
		return
	}
	delete(t.commits, k)
	select {
	case e.commit <- ans:
	default:
	}
}

// commit queues a COMMIT (an abort from the rx loop); under t.mu is fine
// (the control sender never takes it).
func (a *Agent) commit(v int, peer fabric.Addr, token uint32, port uint16, status uint8) {
	a.host.Queue(v, wire.Ctl{Peer: peer, Conn: token, Tag: wire.TagCommit, Port: port, Status: status})
}

// clientDirectClaim is the client's side once a CLAIM_DIRECT (or
// CLAIM_RDIRECT) came: open the buffer and COMMIT (sent from this
// goroutine: the acceptor waits on it), or abort and stay TCP when open
// fails. Across hosts, open makes this side's buffer and engine
// connection and fills in di's ClientID and ClientNLA, which COMMIT_R
// carries.
func (a *Agent) clientDirectClaim(ctx context.Context, v int, peer fabric.Addr, port uint16, ans claimAns, open func(*DirectInfo) error) (Answer, *DirectInfo, error) {
	di := &DirectInfo{Node: peer.Node, Token: ans.token, ID: ans.id, Ring: ans.ring, Remote: ans.remote, NLA: ans.nla}
	status := uint8(1)
	oerr := open(di)
	if oerr == nil && di.Remote && (di.ClientID == 0 || di.ClientNLA == 0) {
		oerr = errors.New("open named no engine connection for a cross-host direct connection")
	}
	if oerr != nil {
		a.host.Warn("extds: cannot open the direct buffer, using tcp", "node", peer.Node, "err", oerr)
		status = 0
	}
	var fm [1]fabric.Message
	if status == 1 && di.Remote {
		wire.EncCommitR(&fm[0], peer, ans.token, port, di.ClientID, di.ClientNLA)
	} else {
		wire.EncCommit(&fm[0], peer, ans.token, port, status)
	}
	err := a.sendNow(ctx, v, &fm)
	switch {
	case err != nil && oerr == nil:
		// The acceptor will fail the connection without our COMMIT.
		a.ctr.handshakeErr.Add(1)
		return 0, nil, fmt.Errorf("%w: %w", ErrCommitUnsent, err)
	case oerr != nil:
		return DirectAbort, nil, nil
	}
	return Direct, di, nil
}
