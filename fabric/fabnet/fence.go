package fabnet

// The PUT fence: how fabnet keeps fabric.PutOrderer's promise on one
// TCP stream (session.go, "PUT order").
//
//	Post(PUT) ──► queueBulk: seq = putSeq++, openPuts[VPID]++
//	Send ──► queueVELO: the frame goes to s.ctl, or, while its VPID has a
//	   PUT with chunks left or a frame already fenced, to s.fenced with
//	   need = putSeq (it waits for that VPID's PUTs numbered below need)
//	takeLocked ──► releaseFencedLocked first: fenced frames whose PUTs
//	   are all taken move, in order, to the end of s.ctl (this batch,
//	   written after every earlier batch and so after those PUTs' last
//	   chunks); then the batch's chunks, each PUT's last one decrementing
//	   openPuts.
//
// Only PUTs fence, and only the frames of the endpoint that posted them:
// GET responses and other endpoints' frames (EXT-Eth's eager frames on
// VPID 0 while VPID 2 streams) never wait behind bulk data. Everything
// here runs under wmu.

import "github.com/exn-project/exn/fabric"

// fence is one frame held in s.fenced.
type fence struct {
	end  int         // its end in s.fenced
	vpid fabric.VPID // the sending endpoint
	need uint64      // it waits for vpid's PUTs with seq < need
}

// mustFenceLocked says whether a frame VPID a sends now must wait: a has
// a PUT with chunks left, or an earlier frame of a waits (which this one
// may not overtake).
func (s *session) mustFenceLocked(a fabric.VPID) bool {
	if len(s.openPuts) == 0 && len(s.fences) == 0 {
		return false // every VELO frame asks: no PUT open, no map lookup
	}
	if s.openPuts[a] > 0 {
		return true
	}
	for i := range s.fences {
		if s.fences[i].vpid == a {
			return true
		}
	}
	return false
}

// putQueuedLocked numbers a PUT just queued and counts it open.
func (s *session) putQueuedLocked(b *bulk) {
	b.seq = s.putSeq
	s.putSeq++
	if s.openPuts == nil {
		s.openPuts = make(map[fabric.VPID]int)
	}
	s.openPuts[b.a]++
}

// putTakenLocked: b's last chunk (or its abort) is in the batch being
// built. A VPID with no PUT left leaves the map, so an empty map means no
// PUT open at all.
func (s *session) putTakenLocked(b *bulk) {
	if s.openPuts[b.a]--; s.openPuts[b.a] == 0 {
		delete(s.openPuts, b.a)
	}
}

// waitsLocked says whether a PUT of vpid numbered below need still has
// chunks to take.
func (s *session) waitsLocked(vpid fabric.VPID, need uint64) bool {
	if s.openPuts[vpid] == 0 {
		return false
	}
	for _, b := range s.bulk {
		if b.put && b.a == vpid && b.seq < need {
			return true
		}
	}
	return false
}

// releaseFencedLocked moves the fenced frames whose PUTs are all taken to
// the end of s.ctl, in order, up to the first that still waits (frames
// behind it keep their place: they may be its endpoint's).
func (s *session) releaseFencedLocked() {
	n, end := 0, 0
	for n < len(s.fences) && !s.waitsLocked(s.fences[n].vpid, s.fences[n].need) {
		end = s.fences[n].end
		n++
	}
	if n == 0 {
		return
	}
	s.ctl = append(s.ctl, s.fenced[:end]...)
	rest := copy(s.fenced, s.fenced[end:])
	s.fenced = s.fenced[:rest]
	k := copy(s.fences, s.fences[n:])
	s.fences = s.fences[:k]
	for i := range s.fences {
		s.fences[i].end -= end
	}
}
