package exn

// Housekeeping, run by rxLoop on each tick of the ticker goroutine
// (engine.go), while needTicks (rx.go) says there is something to watch:
//
//	tx slots armed past their advert timeout ──► reclaimed (a live
//	  receiver gets liveAdvertFactor times longer: it may still pull)
//	sources the NIC reports down ──► capability forgotten, grants taken
//	  back (push.go), partial and queued frames dropped (peer-gone);
//	  forgotten once no GET of theirs is in flight
//
// State: rxLoop's own (rx.sources, their queues); tx slot states are
// atomic words (tx.go).

// housekeep reclaims expired adverts and cleans up after dead sources.
func (e *Engine) housekeep() {
	now := e.cfg.Now().UnixNano()
	for i := range e.tx.slots {
		s := &e.tx.slots[i]
		w := s.state.Load()
		if w&slotArmed == 0 || now < s.deadline.Load() {
			continue
		}
		// A live peer may still pull: wait longer (liveAdvertFactor).
		hard := s.deadline.Load() + int64(liveAdvertFactor-1)*int64(e.cfg.AdvertTimeout)
		if now < hard && e.nic.Alive(wordNode(w)) == nil {
			continue
		}
		if s.state.CompareAndSwap(w, 0) {
			e.ctr.advertTimeouts.Add(1)
			e.ctr.outstandingAdverts.Add(-1)
			e.log.Warn("exn: advert never pulled, slot reclaimed", "node", wordNode(w), "len", wordLen(w))
			e.tx.free <- int32(i)
		}
	}
	rx := &e.rx
	for node, src := range rx.sources {
		if e.nic.Alive(node) == nil {
			continue
		}
		e.forgetPeer(node)
		e.releaseGrants(src)
		if src.uc.buf != nil {
			src.uc.reset(rx.pool)
			e.drop(DropPeerGone, node)
		}
		if src.mc.buf != nil {
			src.mc.reset(rx.pool)
			e.drop(DropPeerGone, node)
		}
		pending := 0
		for abs := src.qhead; abs < src.qhead+uint64(src.qlen); abs++ {
			ent := src.at(abs)
			switch ent.state {
			case qReady:
				switch {
				case ent.buf != nil:
					rx.pool.put(ent.buf)
				case ent.view.Token != nil:
					rx.viewer.EndView(&ent.view, false)
				default:
					e.freeRxSlot(ent.slot)
				}
				*ent = qent{state: qFailed, slot: -1}
				e.drop(DropPeerGone, node)
			case qWaiting:
				ent.state = qFailed
				src.waiting--
				e.ctr.waitingAdverts.Add(-1)
				e.drop(DropPeerGone, node)
			case qPending:
				pending++ // its error notification frees the buffer
			}
		}
		e.markDirty(src)
		if pending == 0 && src.waiting == 0 {
			// Forget it; a restarted peer starts afresh. Stale waitq
			// entries see waiting == 0 and are skipped.
			src.gone = true
			delete(rx.sources, node)
			if rx.last == src {
				rx.last = nil
			}
		}
	}
}
