package extds

// Direct agreement over the fabric (issue #15). When the client can take
// a direct connection (docs/direct.md) and the acceptor makes them, the
// agreement rides on the CLAIM exchange instead of the shadow TCP
// connection, so that nothing but the kernel's TCP handshake crosses
// exn0 while a connection is set up:
//
//	client's exnd                                accepting exnd
//	CLAIM, flags = claimDirect ────────────────→ (acceptor called ClaimDirect)
//	                                             create(): the buffer
//	          ←───────────────────────────────── CLAIM_DIRECT: token, ID, ring
//	open(info)
//	COMMIT {token, 1} ─────────────────────────→ both return the DirectInfo
//	  or, if open fails, or the answer came
//	  after the client gave up: COMMIT {token, 0} → both stay plain TCP
//
// Nothing is written into the shadow connection by either side, so an
// abort leaves both programs plain TCP streams, untouched. Once it sent
// COMMIT the client is direct; an accepting exnd that gets no COMMIT
// within the handshake timeout fails the connection (an error, so the
// caller resets what it made) rather than fall back, because the client
// may be direct by then. An acceptor whose create fails answers with an
// ordinary CLAIM_REPLY (agreed): the client then offers direct in the
// shadow handshake (direct.go) and gets the relay.
//
// Wire (VELO; the header's conn field as shown):
//
//	CLAIM         claim.go; its flags word, bit 0 = claimDirect
//	CLAIM_DIRECT  conn = the client's CLAIM token:
//	              sport u16, 0 u16, token u32, ring u32, ID u64        24 bytes
//	COMMIT        conn = the server's token (CLAIM_DIRECT's):
//	              sport u16, status u8 (1 commit, 0 abort), 0 u8        8 bytes
//
// COMMIT is matched by (fabric source, token): a sender cannot forge the
// source, and the token is the accepting exnd's own.
//
// Locking: claimTable.mu as in claim.go (a leaf lock: channels are sent
// to without blocking under it; nothing waits under it). The acceptor's
// wake hook runs after the lock is released.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/exn-project/exn/fabric"
)

// Tags of the direct agreement. 0x50 and 0x51 are fabric/fping's.
const (
	TagClaimDirect fabric.Tag = 0x52
	TagCommit      fabric.Tag = 0x53
)

const (
	claimDirectLen = 24
	commitLen      = 8
	// claimDirect is the CLAIM flag of a client that can take a direct
	// connection.
	claimDirect uint32 = 1
	// statusDirectAns is the status a client's waiter gets for a
	// CLAIM_DIRECT (CLAIM_REPLY's are 0 and 1).
	statusDirectAns uint8 = 2
)

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
}

var (
	errNoCommit     = errors.New("extds: the client did not commit the direct connection in time")
	errCommitUnsent = errors.New("extds: cannot send COMMIT")
)

// ClaimDirect is Claim for an acceptor that makes direct connections: a
// CLAIM that offers one is not agreed by the rx loop but recorded, and
// wake is called (from the rx loop, without locks held; it must not
// block) so that the acceptor, which may be waiting for the shadow
// connection's first bytes, looks at DirectPending and calls AgreeDirect.
// A CLAIM that does not offer one is agreed as by Claim.
func (d *Device) ClaimDirect(key TupleKey, wake func()) *Claim { return d.claim(key, wake) }

// DirectPending reports whether a direct CLAIM is waiting for AgreeDirect.
func (c *Claim) DirectPending() bool {
	t := &c.d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[c.key]
	return e != nil && e.st == stDirect
}

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
	d, t := c.d, &c.d.claims
	t.mu.Lock()
	e := t.m[c.key]
	if e == nil || e.st != stDirect {
		t.mu.Unlock()
		return nil, nil, errors.New("extds: no direct claim pending")
	}
	from, vd, ctok := e.from, e.vd, e.token
	t.mu.Unlock()

	di, err := create()
	t.mu.Lock()
	if t.m[c.key] != e || e.st != stDirect {
		t.mu.Unlock()
		return nil, nil, errors.New("extds: direct claim ended while the buffer was made")
	}
	ck := commitKey{from, di.Token}
	if _, dup := t.commits[ck]; err == nil && dup {
		err = fmt.Errorf("token %#x in use", di.Token)
	}
	if err != nil {
		d.rlog.warn("extds: cannot make a direct connection, using the relay", "err", err)
		e.st = stAgreed
		d.claimReply(e, c.key.Local.Port(), 1, 0)
		t.mu.Unlock()
		return nil, nil, nil
	}
	e.st, e.commit, e.ck = stReplied, make(chan uint8, 1), ck
	t.commits[ck] = e
	t.mu.Unlock()

	var fm [1]fabric.Message
	encClaimDirect(&fm[0], from, ctok, c.key.Local.Port(), di)
	if err := vd.sendNow(ctx, &fm); err != nil {
		d.ctr.handshakeErr.Add(1)
		return nil, nil, fmt.Errorf("send CLAIM_DIRECT: %w", err)
	}
	if prepare != nil {
		prepare(di)
	}
	timer := time.NewTimer(d.cfg.handshakeTO)
	defer timer.Stop()
	select {
	case st := <-e.commit:
		if st == 1 {
			d.ctr.directAgreed.Add(1)
			return nil, &di, nil
		}
		return d.fallback(shadow, nil, FallbackDirectAbort), nil, nil
	case <-timer.C:
		d.ctr.handshakeErr.Add(1)
		return nil, nil, errNoCommit
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-d.ctx.Done():
		return nil, nil, net.ErrClosed
	}
}

// onClaimDirect hands a CLAIM_DIRECT to the client waiting for it, or
// aborts one nobody waits for (the client gave up and went TCP), so that
// the accepting exnd goes TCP too at once (rx loop; never blocks).
func (d *Device) onClaimDirect(v *vdev, from fabric.Addr, m *msg) {
	port, tok, ring, id, ok := decodeClaimDirect(m.data)
	if !ok {
		d.drop(DropProbe, "from", from, "why", "malformed direct claim answer")
		return
	}
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.waitingLocked(v, from, m.conn, port); w != nil && w.direct {
		select {
		case w.ch <- claimAns{status: statusDirectAns, token: tok, ring: ring, id: id}:
			return
		default:
		}
	}
	d.drop(DropProbe, "from", from, "token", m.conn, "why", "direct claim answer matches no waiting claim")
	d.commit(v, from, tok, port, 0)
}

// onCommit hands a COMMIT to the acceptor waiting for it (rx loop).
func (d *Device) onCommit(v *vdev, from fabric.Addr, m *msg) {
	port, status, ok := statusBody(m, commitLen)
	if !ok || m.data[3] != 0 {
		d.drop(DropProbe, "from", from, "why", "malformed commit")
		return
	}
	t := &d.claims
	t.mu.Lock()
	defer t.mu.Unlock()
	k := commitKey{from, m.conn}
	e := t.commits[k]
	if e == nil || e.vd != v || e.sport != port {
		d.drop(DropProbe, "from", from, "token", m.conn, "why", "commit matches no direct claim")
		return
	}
	delete(t.commits, k)
	select {
	case e.commit <- status:
	default:
	}
}

// commit queues a COMMIT (an abort from the rx loop); under t.mu is fine
// (the control sender never takes it).
func (d *Device) commit(v *vdev, peer fabric.Addr, token uint32, port uint16, status uint8) {
	d.queueCtl(ctrlReq{vd: v, peer: peer, conn: token, tag: TagCommit, port: port, status: status})
}

// clientDirectClaim is the client's side once a CLAIM_DIRECT came: open
// the buffer and COMMIT (sent from this goroutine: the acceptor waits on
// it), or abort and stay TCP when open fails.
func (d *Device) clientDirectClaim(ctx context.Context, v *vdev, peer fabric.Addr, port uint16, a claimAns, open func(DirectInfo) error) (*DirectInfo, FallbackReason, error) {
	di := &DirectInfo{Node: peer.Node, Token: a.token, ID: a.id, Ring: a.ring}
	status := uint8(1)
	oerr := open(*di)
	if oerr != nil {
		d.rlog.warn("extds: cannot open the direct buffer, using tcp", "node", peer.Node, "err", oerr)
		status = 0
	}
	var fm [1]fabric.Message
	encCommit(&fm[0], peer, a.token, port, status)
	err := v.sendNow(ctx, &fm)
	switch {
	case err != nil && oerr == nil:
		// The acceptor will fail the connection without our COMMIT.
		d.ctr.handshakeErr.Add(1)
		return nil, 0, fmt.Errorf("%w: %w", errCommitUnsent, err)
	case oerr != nil:
		return nil, FallbackDirectAbort, nil
	}
	return di, 0, nil
}

func decodeClaimDirect(p []byte) (port uint16, token, ring uint32, id uint64, ok bool) {
	if len(p) != claimDirectLen-hdrLen || binary.LittleEndian.Uint16(p[2:]) != 0 {
		return 0, 0, 0, 0, false
	}
	port = binary.LittleEndian.Uint16(p)
	token = binary.LittleEndian.Uint32(p[4:])
	ring = binary.LittleEndian.Uint32(p[8:])
	id = binary.LittleEndian.Uint64(p[12:])
	return port, token, ring, id, port != 0 && token != 0 && ring != 0
}

func encClaimDirect(fm *fabric.Message, peer fabric.Addr, ctoken uint32, port uint16, di DirectInfo) {
	putHdr(fm, peer, TagClaimDirect, ctoken, claimDirectLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	binary.LittleEndian.PutUint16(fm.Data[6:], 0)
	binary.LittleEndian.PutUint32(fm.Data[8:], di.Token)
	binary.LittleEndian.PutUint32(fm.Data[12:], di.Ring)
	binary.LittleEndian.PutUint64(fm.Data[16:], di.ID)
}

func encCommit(fm *fabric.Message, peer fabric.Addr, token uint32, port uint16, status uint8) {
	putHdr(fm, peer, TagCommit, token, commitLen)
	binary.LittleEndian.PutUint16(fm.Data[4:], port)
	fm.Data[6], fm.Data[7] = status, 0
}
