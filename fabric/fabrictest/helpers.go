package fabrictest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/testenv"
)

// Factory returns n NICs of one new fabric with node IDs 1..n. It registers
// cleanup (closing the NICs and whatever backs the fabric) with t.
type Factory func(t testing.TB, n int) []fabric.NIC

// Timeouts of the suite. They bound every wait so a broken backend fails
// instead of hanging; they are generous for a loaded 2-core CI machine.
const (
	// deadline bounds waiting for something that must happen.
	deadline = 10 * time.Second
	// settle is how long a "nothing else arrives" check waits when no
	// ordered marker can prove absence.
	settle = 20 * time.Millisecond
	// prompt bounds how long a blocked call may take to return after the
	// event that must unblock it.
	prompt = 3 * time.Second
)

// OpenEP opens VPID v of n, failing t if it cannot; the endpoint is closed
// when t ends.
func OpenEP(t testing.TB, n fabric.NIC, v fabric.VPID) fabric.Endpoint {
	t.Helper()
	ep, err := n.Open(v)
	if err != nil {
		t.Fatalf("node %d: open vpid %d: %v", n.Node(), v, err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

// NICs opens nodes 1..n with newNIC, failing t if one cannot be opened;
// each is closed when t ends. It is the body of most Factories.
func NICs(t testing.TB, n int, newNIC func(fabric.NodeID) (fabric.NIC, error)) []fabric.NIC {
	t.Helper()
	nics := make([]fabric.NIC, n)
	for i := range nics {
		nic, err := newNIC(fabric.NodeID(i + 1))
		if err != nil {
			t.Fatalf("open node %d: %v", i+1, err)
		}
		nics[i] = nic
		t.Cleanup(func() { nic.Close() })
	}
	return nics
}

// Spawn runs f(0) to f(n-1), each in a goroutine of its own, and returns
// a function that waits for them all and returns their errors joined (nil
// if none failed). It does not touch a testing.TB, so f may run after the
// test's goroutine has moved on; the returned function may be called more
// than once.
func Spawn(n int, f func(i int) error) (wait func() error) {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	return func() error {
		wg.Wait()
		return errors.Join(errs...)
	}
}

// Register registers a region of size bytes on ep, failing t if it
// cannot.
func Register(t testing.TB, ep fabric.Endpoint, size int) fabric.Region {
	t.Helper()
	r, err := ep.Register(size)
	if err != nil {
		t.Fatalf("%v: register %d: %v", ep.Addr(), size, err)
	}
	return r
}

// msg builds a message to peer with an 8-byte sequence number followed by
// fill bytes up to size.
func msg(peer fabric.Addr, tag fabric.Tag, seq uint64, size int) fabric.Message {
	m := fabric.Message{Peer: peer, Tag: tag, Len: uint8(size)}
	if size >= 8 {
		binary.LittleEndian.PutUint64(m.Data[:8], seq)
		for i := 8; i < size; i++ {
			m.Data[i] = byte(seq) + byte(i)
		}
	}
	return m
}

func seqOf(m *fabric.Message) uint64 { return binary.LittleEndian.Uint64(m.Data[:8]) }

// recvN receives exactly n messages, failing t if they do not arrive in
// time.
func recvN(t testing.TB, ep fabric.Endpoint, n int) []fabric.Message {
	t.Helper()
	return takeN(t, ep, n, ep.Recv, "recv", "message")
}

// pollN receives exactly n notifications.
func pollN(t testing.TB, ep fabric.Endpoint, n int) []fabric.Notification {
	t.Helper()
	return takeN(t, ep, n, ep.PollNotifications, "poll notifications", "notification")
}

// takeN takes exactly n items from ep with get (Recv or
// PollNotifications), sleeping in ep.Wait while none is there, failing t
// if they do not arrive before the deadline. op and item name the call and
// what it returns in failures.
func takeN[T any](t testing.TB, ep fabric.Endpoint, n int, get func([]T) (int, error), op, item string) []T {
	t.Helper()
	out := make([]T, 0, n)
	buf := make([]T, 64)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for len(out) < n {
		k, err := get(buf[:min(len(buf), n-len(out))])
		if err != nil {
			t.Fatalf("%v: %s: %v", ep.Addr(), op, err)
		}
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if err := ep.Wait(ctx); err != nil {
			t.Fatalf("%v: waiting for %s %d of %d: %v", ep.Addr(), item, len(out)+1, n, err)
		}
	}
	return out
}

// RecvWait receives into in, sleeping in ep.Wait while nothing has
// arrived, and returns how many messages it got (at least one). It fails
// tb on an error from ep or ctx. It allocates nothing, so benchmarks use
// it in their timed loops.
func RecvWait(tb testing.TB, ctx context.Context, ep fabric.Endpoint, in []fabric.Message) int {
	tb.Helper()
	return awaitSome(tb, ctx, ep, fabric.Endpoint.Recv, in)
}

// SendRecv sends one 4-byte message from one endpoint to another and
// waits until the other has it (RecvWait): the smallest round of
// traffic, for tests that need the fabric to have carried something.
func SendRecv(tb testing.TB, ctx context.Context, from, to fabric.Endpoint) {
	tb.Helper()
	if _, err := from.Send(ctx, []fabric.Message{{Peer: to.Addr(), Len: 4}}); err != nil {
		tb.Fatal(err)
	}
	var m [1]fabric.Message
	RecvWait(tb, ctx, to, m[:])
}

// PollWait is RecvWait for notifications.
func PollWait(tb testing.TB, ctx context.Context, ep fabric.Endpoint, ns []fabric.Notification) int {
	tb.Helper()
	return awaitSome(tb, ctx, ep, fabric.Endpoint.PollNotifications, ns)
}

func awaitSome[T any](tb testing.TB, ctx context.Context, ep fabric.Endpoint, get func(fabric.Endpoint, []T) (int, error), buf []T) int {
	tb.Helper()
	k, err := await(ctx, ep, get, buf)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// AwaitRecv is RecvWait for a benchmark's measured loop: it returns the
// error instead of failing, and so costs no testing.TB.Helper call (a
// stack walk) per message.
func AwaitRecv(ctx context.Context, ep fabric.Endpoint, in []fabric.Message) (int, error) {
	return await(ctx, ep, fabric.Endpoint.Recv, in)
}

// await calls get on ep until it returns something, waiting on ep
// between empty calls. get is a method expression (fabric.Endpoint.Recv):
// a method value bound to ep would be an allocation per call.
func await[T any](ctx context.Context, ep fabric.Endpoint, get func(fabric.Endpoint, []T) (int, error), buf []T) (int, error) {
	for {
		k, err := get(ep, buf)
		if err != nil || k > 0 {
			return k, err
		}
		if err := ep.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// noNotifications fails t if ep has a notification after a short settle.
func noNotifications(t testing.TB, ep fabric.Endpoint) {
	t.Helper()
	time.Sleep(settle)
	var buf [4]fabric.Notification
	k, err := ep.PollNotifications(buf[:])
	if err != nil {
		t.Fatalf("%v: poll: %v", ep.Addr(), err)
	}
	if k != 0 {
		t.Fatalf("%v: unexpected notifications %+v", ep.Addr(), buf[:k])
	}
}

func send(t testing.TB, ep fabric.Endpoint, msgs ...fabric.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if n, err := ep.Send(ctx, msgs); err != nil || n != len(msgs) {
		t.Fatalf("%v: send %d: n=%d err=%v", ep.Addr(), len(msgs), n, err)
	}
}

func post(t testing.TB, ep fabric.Endpoint, reqs ...fabric.RMA) {
	t.Helper()
	if n, err := ep.Post(reqs); err != nil || n != len(reqs) {
		t.Fatalf("%v: post %d: n=%d err=%v", ep.Addr(), len(reqs), n, err)
	}
}

func wantErr(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, deadline, cond)
}

// result is the outcome of a call run in another goroutine.
type result struct {
	n   int
	err error
}

// within waits for a call result, failing t if it takes longer than d.
func within(t testing.TB, what string, ch <-chan result, d time.Duration) result {
	t.Helper()
	return testenv.Within(t, what, ch, d)
}

// stillBlocked fails t if ch already has a result.
func stillBlocked(t testing.TB, what string, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned early: n=%d err=%v", what, r.n, r.err)
	case <-time.After(settle):
	}
}

// fillAndBlock starts a goroutine sending up to limit messages from src to
// dst and returns once the sender is blocked on a full mailbox (Stats
// SendBlocked rose on srcNIC). The returned channel gets the Send result.
func fillAndBlock(t testing.TB, srcNIC fabric.NIC, src fabric.Endpoint, dst fabric.Addr, ctx context.Context) (<-chan result, int) {
	t.Helper()
	const limit = 1 << 16 // far above any sane mailbox (default 1024 slots)
	before := srcNIC.Stats().SendBlocked
	msgs := make([]fabric.Message, limit)
	for i := range msgs {
		msgs[i] = msg(dst, 1, uint64(i), 16)
	}
	ch := make(chan result, 1)
	go func() {
		n, err := src.Send(ctx, msgs)
		ch <- result{n, err}
	}()
	end := time.Now().Add(deadline)
	for srcNIC.Stats().SendBlocked == before {
		select {
		case r := <-ch:
			t.Fatalf("sent %d messages without back-pressure (err %v): mailbox unbounded?", r.n, r.err)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("sender never blocked")
		}
		time.Sleep(100 * time.Microsecond)
	}
	return ch, limit
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func checkBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d = %#x, want %#x", what, i, got[i], want[i])
		}
	}
}

func errClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

func describe(n fabric.Notification) string {
	return fmt.Sprintf("%v %v err=%v peer=%v len=%d local=%v", n.Kind, n.Op, n.Err, n.Peer, n.Len, n.Local)
}
