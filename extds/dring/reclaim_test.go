package dring

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// resident is e's outbound pages now.
func resident(tb testing.TB, e *Endpoint) int {
	tb.Helper()
	n, err := e.TxResident()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestReclaimTx: an empty ring's pages go back, and a ring that is not
// empty, or whose lock a producer holds, or that is closed, is left
// alone; the stream goes on right after a reclaim.
func TestReclaimTx(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const ring = 64 << 10
	for _, tc := range []struct {
		name   string
		unread int    // bytes left in the ring
		lock   uint32 // prod_lock's value during the reclaim
		closed bool
		freed  bool
	}{
		{name: "empty", freed: true},
		{name: "unread", unread: 100},
		{name: "writer holds the lock", lock: 1},
		{name: "writer holds it, with waiters", lock: 2},
		{name: "another reclaim holds it", lock: lockReclaim},
		{name: "closed", closed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, ring)
			msg := bytes.Repeat([]byte{0xa5}, ring)
			if _, err := a.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(b, make([]byte, ring)); err != nil {
				t.Fatal(err)
			}
			if tc.unread > 0 {
				if _, err := a.Write(msg[:tc.unread]); err != nil {
					t.Fatal(err)
				}
			}
			before := resident(t, a)
			if before != ring/4096 {
				t.Fatalf("%d pages resident after a ring's worth, want %d", before, ring/4096)
			}
			a.tx.prodLock.Store(tc.lock)
			if tc.closed {
				a.Close()
			}
			freed, err := a.ReclaimTx()
			if err != nil || freed != tc.freed {
				t.Fatalf("ReclaimTx = %v, %v; want %v", freed, err, tc.freed)
			}
			if tc.closed {
				return
			}
			if got := a.tx.prodLock.Load(); got != tc.lock {
				t.Fatalf("prod_lock %d after ReclaimTx, want %d", got, tc.lock)
			}
			a.tx.prodLock.Store(0)
			after := resident(t, a)
			if tc.freed && after != 0 || !tc.freed && after != before {
				t.Fatalf("%d pages resident after ReclaimTx (freed %v), %d before", after, freed, before)
			}
			// The stream goes on: the unread bytes, then new ones.
			if _, err := a.Write([]byte("after")); err != nil {
				t.Fatal(err)
			}
			want := append(bytes.Clone(msg[:tc.unread]), "after"...)
			got := make([]byte, len(want))
			if _, err := io.ReadFull(b, got); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("read %q, %v after the reclaim; want %q", got, err, want)
			}
		})
	}
}

// TestReclaimTxRace reclaims as fast as it can while a writer streams a
// counting pattern in bursts (the ring empties between them) and a reader
// checks every byte: a page punched after a producer wrote it would read
// as zeros. Writers park on the lock a reclaim holds, never lose a byte.
func TestReclaimTxRace(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	const ring = 16 << 10
	total := 8 << 20
	if testenv.Small() {
		total = 1 << 20
	}
	a, b := pair(t, ring)
	var stop atomic.Bool
	var freed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	wg.Add(3)
	go func() { // the reclaimer
		defer wg.Done()
		for !stop.Load() {
			ok, err := a.ReclaimTx()
			if err != nil {
				errs <- err
				return
			}
			if ok {
				freed.Add(1)
			}
		}
	}()
	go func() { // the writer: bursts of 1..3 rings, a pause after each
		defer wg.Done()
		buf := make([]byte, 3*ring)
		for off, burst := 0, 1; off < total; burst = burst%3 + 1 {
			n := min(burst*ring-burst*7, total-off)
			for i := range buf[:n] {
				buf[i] = byte((off + i) % 251)
			}
			if _, err := a.Write(buf[:n]); err != nil {
				errs <- err
				return
			}
			off += n
			time.Sleep(20 * time.Microsecond)
		}
		a.CloseWrite()
	}()
	go func() { // the reader
		defer wg.Done()
		buf := make([]byte, 5000)
		off := 0
		for {
			n, err := b.Read(buf)
			for i := range buf[:n] {
				if buf[i] != byte((off+i)%251) {
					errs <- fmt.Errorf("byte %d is %d, want %d", off+i, buf[i], (off+i)%251)
					stop.Store(true)
					b.CloseRead() // the writer fails instead of waiting for space
					return
				}
			}
			off += n
			if errors.Is(err, io.EOF) {
				if off != total {
					errs <- fmt.Errorf("EOF after %d bytes, want %d", off, total)
				}
				break
			}
			if err != nil {
				errs <- err
				break
			}
		}
		stop.Store(true)
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if freed.Load() == 0 {
		t.Error("no reclaim found the ring empty: the test proved nothing")
	}
	t.Logf("%d reclaims during %d bytes", freed.Load(), total)
}
