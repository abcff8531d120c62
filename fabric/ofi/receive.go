//go:build ofi && cgo

package ofi

// Receive path (one packet at a time, from the progress step that read
// its completion, under progMu; dispatch alone also for a control packet
// this node sends to itself, from any goroutine):
//
//	exn_poll (staged copy, buffer reposted) ──► receive: length, header
//	         decode, the claimed node checked against the libfabric
//	         source address (byFI, peersMu read lock); a packet that is
//	         torn, undecodable or from an unverifiable source is counted
//	         Corrupt and dropped
//	     ──► pBye: peer down, answered with pByeAck; pByeAck: our goodbye
//	         acknowledged
//	     ──► anything else from a peer marked down revives it (peerUp)
//	     ──► dispatch by type: VELO and multicast into the target VPID's
//	         mailbox (endpoint.mu; bundles: bundle.go), open queries and
//	         answers, credits and pClosed to the pairs (pair.mu), region
//	         queries, answers and invalidations (rma.go: regs, rcMu,
//	         relMu), notifications into the target VPID's queue (the
//	         core's NotifyQueue lock), hello (forget the peer's bells)
//
// Answers (pOpenA, pRegA, pByeAck, ...) go out through sendCtl (ctlMu:
// fi_inject at once or queued for progress), with none of the locks above
// held. The only wait is peerDown's (pBye), for a call to that peer
// already in libfabric.

import "github.com/exn-project/exn/fabric"

// receive parses one packet from libfabric address src.
func (n *NIC) receive(b []byte, src uint64) {
	if len(b) < headerSize {
		n.ctr.Corrupt.Add(1)
		return
	}
	h, err := decodeHeader(getHeader(b))
	if err != nil {
		n.ctr.Corrupt.Add(1)
		n.faults.Warn("ofi undecodable packet dropped", "err", err)
		return
	}
	n.peersMu.RLock()
	p := n.byFI[src]
	n.peersMu.RUnlock()
	if p == nil || p.node != h.desc.Node {
		// Unknown source address, or a node ID that does not match it:
		// forged or misconfigured; either way not trusted.
		n.ctr.Corrupt.Add(1)
		n.faults.Warn("ofi packet with unverifiable source dropped", "claimed", h.desc.Node, "fi_addr", src)
		return
	}
	switch h.typ {
	case pBye:
		n.peerDown(p, whyGoodbye)
		n.sendCtl(p.node, header{typ: pByeAck}, nil)
		return
	case pByeAck:
		p.acked.Store(true)
		return
	}
	if !p.isUp.Load() {
		if p.deadByMembership.Load() && !n.members.Alive(p.node) {
			// A node membership declared dead (frozen, then thawed)
			// comes back through membership, not through its stale
			// traffic: everything bound to it was already released.
			n.fromDead.Add(1)
			n.faults.Warn("ofi packet from a node membership declared dead dropped", "peer", p.node)
			return
		}
		n.peerUp(p)
	}
	n.dispatch(h, p.node, b[headerSize:])
}

// dispatch handles a verified packet from node src.
func (n *NIC) dispatch(h header, src fabric.NodeID, body []byte) {
	switch h.typ {
	case pVELO, pMcast:
		if len(body) != int(h.desc.Len) {
			n.ctr.Corrupt.Add(1) // a torn or padded message: deliver no stale bytes
			return
		}
		e := n.eps[h.dst].Load()
		if e == nil || e.epoch != h.epoch {
			return // for a VPID that closed: its mailbox is gone
		}
		e.deliver(h, src, body)
	case pBundle:
		e := n.eps[h.dst].Load()
		if e == nil || e.epoch != h.epoch {
			return
		}
		e.deliverBundle(h, src, body)
	case pOpenQ:
		n.handleOpenQ(h, src)
	case pOpenA:
		if err := need(body, openABody, "open answer"); err != nil {
			n.ctr.Corrupt.Add(1)
			return
		}
		if e := n.eps[h.dst].Load(); e != nil {
			bundles := len(body) > openAFlags && body[openAFlags]&openABundles != 0
			e.openAnswer(fabric.Addr{Node: src, VPID: h.desc.VPID}, body[0], h.epoch, int(le32(body[1:])), bundles)
		}
	case pCredit:
		if err := need(body, creditBody, "credit"); err != nil {
			n.ctr.Corrupt.Add(1)
			return
		}
		if e := n.eps[h.dst].Load(); e != nil {
			e.credit(fabric.Addr{Node: src, VPID: h.desc.VPID}, h.epoch, int(le32(body)))
		}
	case pClosed:
		dst := fabric.Addr{Node: src, VPID: h.desc.VPID}
		n.eps.Each(func(e *endpoint) { e.targetClosed(dst, h.epoch) })
	case pRegQ:
		if err := need(body, regQBody, "region query"); err != nil {
			n.ctr.Corrupt.Add(1)
			return
		}
		n.handleRegQ(h, src, le32(body), le64(body[4:]))
	case pRegA:
		a, err := parseRegAnswer(body)
		if err != nil {
			n.ctr.Corrupt.Add(1)
			return
		}
		n.handleRegA(src, a)
	case pInval:
		if err := need(body, invalBody, "invalidate"); err != nil {
			n.ctr.Corrupt.Add(1)
			return
		}
		n.invalidate(src, le32(body))
	case pInvalAck:
		if err := need(body, invalBody, "invalidate ack"); err != nil {
			n.ctr.Corrupt.Add(1)
			return
		}
		n.invalAcked(src, le32(body))
	case pNotify:
		// One to rmaMerge notifications, of one operation's requests.
		if len(body) == 0 || len(body)%notifyBody != 0 || len(body) > rmaMerge*notifyBody {
			n.ctr.Corrupt.Add(1)
			return
		}
		e := n.eps[h.dst].Load()
		for ; len(body) > 0; body = body[notifyBody:] {
			nt, err := fabric.DecodeNotification(body)
			if err != nil || nt.Kind == fabric.KindRequester {
				n.ctr.Corrupt.Add(1)
				return
			}
			nt.Peer = fabric.Addr{Node: src, VPID: h.desc.VPID} // the verified source, not what the packet says
			if e != nil {
				e.Notify(nt)
			}
		}
	case pHello:
		// The peer is (again) up: receive already revived it. It may
		// have restarted under the same address: new bell files.
		if p := n.peer(src); p != nil {
			n.forgetBell(p)
		}
	}
}

// handleOpenQ answers "is VPID h.dst open?" for source (src, h.desc.VPID):
// it resets that source's credit account and grants a full window.
func (n *NIC) handleOpenQ(h header, src fabric.NodeID) {
	var body [openABody + 1]byte
	reply := header{typ: pOpenA, desc: fabric.Descriptor{VPID: h.dst}, dst: h.desc.VPID}
	e := n.eps[h.dst].Load()
	if e == nil || e.Closed.Load() {
		body[0] = stNotOpen
	} else {
		reply.epoch = e.epoch
		e.openSource(fabric.Addr{Node: src, VPID: h.desc.VPID})
		body[0] = stOK
		putLe32(body[1:], uint32(n.cfg.Credits))
		body[openAFlags] = openABundles
	}
	n.sendCtl(src, reply, body[:])
}
