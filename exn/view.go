package exn

// Rendezvous in place. On a fabric whose endpoint lends a peer's memory
// to read where it lies (fabric.RemoteViewer: fabric/shm, where the
// sender's transmit slot is a file this process maps), an advert's frame
// is not copied into an rx buffer by a GET; the Link writes it straight
// from the sender's slot:
//
//	advert → ViewRemote (the GET's checks: the range must lie in a
//	  region registered to the sender's EthVPID) → dstOK, offload check
//	  → entry ready at once, in the source's queue as a GET's would be
//	drain → delivery batch → Link.DeliverFrames (TAP write from the view)
//	  → EndView(notify): the sender gets the responder notification
//	  its GET would have sent, and frees the slot (responderDone)
//
// That saves one copy of every large frame (the GET's memmove, about 5 %
// of exnd's CPU at iperf3 -P 4 on shm: docs/offload-profile.md) and the
// GET's own notification, and no advert waits for an rx buffer. A view
// the engine drops (wrong destination, forged offload) ends with the
// notification too, as its GET would have; one of a source that died
// ends without it; views still queued when the receive loop stops end
// there (endViews). Everything here runs on rxLoop.
//
// The sender can write its slot while the frame is read from it, as it
// could during a GET: the checks above and the Link's own read then may
// see different bytes. What reaches the TAP is still only bytes that
// peer put in its own slot, behind a virtio-net header built here from
// the advert; the kernel checks that header against the frame it copies
// (virtio_net_hdr_to_skb), as it does for any program writing a TAP.

import "github.com/exn-project/exn/fabric"

// viewAdvert takes the frame that advert a announces in place and makes
// its entry ent (already in src's queue) ready, or failed with the drop
// counted.
func (e *Engine) viewAdvert(src *source, ent *qent, a advert) {
	req := fabric.RMA{
		Op:     fabric.OpGet,
		Peer:   fabric.Addr{Node: src.node, VPID: fabric.EthVPID},
		Remote: a.nla,
		Len:    a.len,
		Notify: fabric.NotifyResponder,
	}
	*ent = qent{state: qReady, proto: ProtoRendezvous, slot: -1, adv: a}
	ne, err := e.rx.viewer.ViewRemote(&req, &ent.view)
	var reason DropReason
	switch {
	case err != nil:
		reason = DropGetPost
	case ne != fabric.NErrNone:
		reason = getDrop(ne)
	default:
		reason = e.pulledDrop(ent.view.Buf, &ent.adv.off)
	}
	if reason != DropNone {
		if ent.view.Token != nil {
			e.rx.viewer.EndView(&ent.view, true) // read, as a GET would have
		}
		*ent = qent{state: qFailed, slot: -1}
		e.drop(reason, src.node)
	} else {
		e.ctr.rxViewed.Add(1)
	}
	e.markDirty(src)
}

// endViews ends the views still queued when the receive loop stops. The
// endpoint is closing or closed: nothing is notified.
func (e *Engine) endViews() {
	if e.rx.viewer == nil {
		return
	}
	for _, src := range e.rx.sources {
		for abs := src.qhead; abs < src.qhead+uint64(src.qlen); abs++ {
			if ent := src.at(abs); ent.view.Token != nil {
				e.rx.viewer.EndView(&ent.view, false)
			}
		}
	}
}
