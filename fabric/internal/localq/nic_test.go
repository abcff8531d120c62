package localq

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/exn-project/exn/fabric"
)

// TestNICPieces: Shut closes once and runs its func only then; SelfAlive
// follows the closed flag; Each visits exactly the open endpoints;
// ClosedChan never blocks; AsNIC never returns a typed nil.
func TestNICPieces(t *testing.T) {
	var mu sync.Mutex
	var closed atomic.Bool
	if err := SelfAlive("test", &closed); err != nil {
		t.Fatalf("SelfAlive of an open NIC: %v", err)
	}
	ran := 0
	if !Shut(&mu, &closed, func() { ran++ }) || ran != 1 {
		t.Fatalf("first Shut: ran %d times", ran)
	}
	if Shut(&mu, &closed, func() { ran++ }) || ran != 1 {
		t.Fatalf("second Shut reported closing or ran f (%d)", ran)
	}
	if err := SelfAlive("test", &closed); !errors.Is(err, net.ErrClosed) || err.Error() != "test: alive: use of closed network connection" {
		t.Fatalf("SelfAlive after Shut: %v", err)
	}

	var eps Endpoints[int]
	a, b := 3, 7
	eps[200].Store(&b)
	eps[1].Store(&a)
	var seen []int
	eps.Each(func(e *int) { seen = append(seen, *e) })
	if len(seen) != 2 || seen[0] != 3 || seen[1] != 7 {
		t.Fatalf("Each saw %v, want [3 7]", seen)
	}

	ch := make(chan struct{})
	if ClosedChan(ch) {
		t.Fatal("ClosedChan of an open channel")
	}
	close(ch)
	if !ClosedChan(ch) {
		t.Fatal("ClosedChan of a closed channel")
	}

	if n, err := AsNIC((*fakeNIC)(nil), net.ErrClosed); n != nil || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("AsNIC with an error: %#v, %v", n, err)
	}
	if n, err := AsNIC(&fakeNIC{}, nil); n == nil || err != nil {
		t.Fatalf("AsNIC without an error: %#v, %v", n, err)
	}
}

// fakeNIC is a fabric.NIC only by its type (AsNIC calls no method).
type fakeNIC struct{ fabric.NIC }
