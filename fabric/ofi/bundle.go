//go:build ofi && cgo

package ofi

// VELO bundles: several messages of one Send call to one (sender VPID,
// target VPID) pair travel as one provider message.
//
//	Send ──► per message, in order: multicast and loopback messages go
//	         alone (the bundle so far is sent first); a unicast message
//	         takes its pair's credit without blocking if it can (else the
//	         bundle so far is sent first, then it blocks as before) and
//	         joins the bundle if the target takes bundles (pOpenA flag)
//	         and it fits, else the bundle is sent and a new one starts
//	     ──► the bundle is sent when the target changes, when it is full,
//	         before anything blocks, and at the end of the call: one
//	         message alone as a plain pVELO packet, two or more as one
//	         pBundle (fi_inject if it fits, else a send slot)
//	receive ──► deliverBundle: every record is checked before any is
//	         delivered; then all go into the mailbox under one lock and
//	         one wake-up.
//
// On an fd provider (ofi:tcp) every provider message is a system call on
// each side and, for a parked receiver, a wake-up; EXT-Eth hands the
// adverts of a TAP read batch to one Send, so this takes them from one
// provider message each to one per batch (docs/fabric-ofi.md, "VELO
// bundles").
//
// pBundle body: records of tag(1) length(1) payload(length), back to
// back, length at most fabric.MaxVELOPayload, the whole body at most
// bundleBody bytes. The outer header is a pVELO header of the pair
// (source node and VPID written by the sender's NIC, target VPID and its
// epoch) with type pBundle, tag and length zero.

import (
	"context"

	"github.com/exn-project/exn/fabric"
)

// bundle is the part of one Send call not sent yet: msgs[first:first+k],
// all to pair pr on peer p, with epoch epoch; body holds their records.
type bundle struct {
	p     *peer
	pr    *pair
	epoch uint8
	first int
	k     int
	n     int // bytes of body used
	body  [bundleBody]byte
}

// Send delivers msgs in order (see fabric.Endpoint). Each message takes a
// credit of its (this VPID, target) pair; without one Send blocks until
// the receiver frees slots, the target VPID closes or its node goes down
// (ErrPeerDown), ctx is done, or this endpoint or NIC closes
// (net.ErrClosed). Consecutive messages to one pair may travel as one
// bundle; a bundle that fails fails from its first message on, which is
// the count Send returns.
func (e *endpoint) Send(ctx context.Context, msgs []fabric.Message) (int, error) {
	if err := e.SendStart(ctx); err != nil {
		return 0, err
	}
	var b bundle
	for i := range msgs {
		m := &msgs[i]
		if err := fabric.CheckSend(m); err != nil {
			if ferr := e.flushBundle(ctx, &b, msgs); ferr != nil {
				return b.first, e.nic.ctr.CountErr(ferr)
			}
			return i, e.nic.ctr.CountErr(err)
		}
		if !m.MC && m.Peer.Node != e.nic.id {
			joined, err := e.bundleTo(ctx, &b, msgs, i)
			if err != nil {
				return b.first, e.nic.ctr.CountErr(err)
			}
			if joined {
				continue
			}
		}
		if err := e.flushBundle(ctx, &b, msgs); err != nil {
			return b.first, e.nic.ctr.CountErr(err)
		}
		var err error
		if m.MC {
			err = e.sendMulticast(ctx, m)
		} else {
			err = e.sendTo(ctx, m.Peer, m, false)
		}
		if err != nil {
			return i, e.nic.ctr.CountErr(err)
		}
		e.CountSent(m)
	}
	if err := e.flushBundle(ctx, &b, msgs); err != nil {
		return b.first, e.nic.ctr.CountErr(err)
	}
	return len(msgs), nil
}

// bundleTo adds unicast message i to b, sending b first if i cannot join
// it. It reports false, having taken nothing, when i must go alone: its
// node is unknown or down, its pair is not open with credit to spare
// (sendTo asks or blocks), or its target takes no bundles. An error is
// b's: its messages were not sent, and i was not taken.
func (e *endpoint) bundleTo(ctx context.Context, b *bundle, msgs []fabric.Message, i int) (bool, error) {
	m := &msgs[i]
	p := e.nic.peer(m.Peer.Node)
	if p == nil || !p.isUp.Load() {
		return false, nil
	}
	pr := e.pair(m.Peer)
	pr.mu.Lock()
	if pr.state != psOpen || pr.credits == 0 || !pr.bundles || e.nic.cfg.NoBundles {
		pr.mu.Unlock()
		return false, nil
	}
	pr.credits--
	epoch := pr.epoch
	pr.mu.Unlock()
	if b.k > 0 && (b.pr != pr || b.epoch != epoch || b.n+bundleRec+int(m.Len) > len(b.body)) {
		if err := e.flushBundle(ctx, b, msgs); err != nil {
			e.giveBack(pr, epoch)
			return false, err
		}
	}
	if b.k == 0 {
		b.p, b.pr, b.epoch, b.first, b.n = p, pr, epoch, i, 0
	}
	b.body[b.n], b.body[b.n+1] = byte(m.Tag), m.Len
	copy(b.body[b.n+bundleRec:], m.Data[:m.Len])
	b.n += bundleRec + int(m.Len)
	b.k++
	return true, nil
}

// giveBack returns a credit taken for a message that did not join a
// bundle, unless the pair was reset meanwhile.
func (e *endpoint) giveBack(pr *pair, epoch uint8) {
	pr.mu.Lock()
	if pr.state == psOpen && pr.epoch == epoch {
		pr.credits++
	}
	pr.mu.Unlock()
}

// flushBundle sends b and empties it: one message as a plain pVELO
// packet, more as one pBundle. On error b.first is the first message
// not sent.
func (e *endpoint) flushBundle(ctx context.Context, b *bundle, msgs []fabric.Message) error {
	if b.k == 0 {
		return nil
	}
	n := e.nic
	h := header{typ: pBundle, desc: fabric.Descriptor{Node: n.id, VPID: e.addr.VPID}, dst: b.pr.dst.VPID, epoch: b.epoch}
	body := b.body[:b.n]
	if b.k == 1 {
		m := &msgs[b.first]
		h.typ, h.desc.Tag, h.desc.Len = pVELO, m.Tag, m.Len
		body = m.Data[:m.Len]
	}
	if err := n.transmitPacket(ctx, e, b.p, h.encode(), body); err != nil {
		return err
	}
	if b.k > 1 {
		n.bundles.Add(1)
	}
	for j := b.first; j < b.first+b.k; j++ {
		e.CountSent(&msgs[j])
	}
	b.k = 0
	return nil
}

// deliverBundle checks every record of a pBundle from (src, h.desc.VPID)
// and then delivers them all, in order, as deliver does one message. A
// malformed bundle is dropped whole and counted as corrupt.
func (e *endpoint) deliverBundle(h header, src fabric.NodeID, body []byte) {
	if err := checkBundle(body); err != nil {
		e.nic.ctr.Corrupt.Add(1)
		e.nic.faults.Warn("ofi malformed bundle dropped", "from", src, "err", err)
		return
	}
	from := fabric.Addr{Node: src, VPID: h.desc.VPID}
	s := e.lockSource(from, "velo bundle")
	if s == nil {
		return
	}
	for len(body) > 0 {
		k := int(body[1])
		e.putLocked(s, from, false, fabric.Tag(body[0]), body[bundleRec:bundleRec+k])
		body = body[bundleRec+k:]
	}
	e.length.Store(int32(e.cnt))
	e.mu.Unlock()
	e.Signal()
}
