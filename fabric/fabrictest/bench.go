package fabrictest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/internal/bytesize"
)

// Bench runs the backend benchmarks. Every sub-benchmark reports
// allocations; RMA bandwidth is also reported as a ratio to a memcpy of the
// same size measured in the same run ("x-memcpy": 1.0 means as fast as a
// local copy).
func Bench(b *testing.B, f Factory) {
	b.Run("VELO/send-recv-120B", func(b *testing.B) { benchSendRecv(b, f) })
	b.Run("VELO/pingpong-120B", func(b *testing.B) { benchPingPong(b, f) })
	b.Run("VELO/rate-120B", func(b *testing.B) { benchRate(b, f) })
	for _, size := range []int{fabric.RMAMTU, 4 << 10, 64 << 10, 1 << 20, fabric.MaxRMALen} {
		for _, op := range []fabric.Op{fabric.OpGet, fabric.OpPut} {
			b.Run(fmt.Sprintf("RMA/%v-%s", op, bytesize.Name(size, "")), func(b *testing.B) { benchRMA(b, f, op, size) })
		}
	}
}

// rateBatch is the batch size of the message-rate sender and of every
// receive loop: the NAPI budget of docs/design.md ("EXT-Eth").
const rateBatch = 64

// benchSendRecv is one goroutine sending one message and receiving it: the
// per-message cost without scheduling, and the allocation proof.
func benchSendRecv(b *testing.B, f Factory) {
	nics := f(b, 2)
	a, r := OpenEP(b, nics[0], 1), OpenEP(b, nics[1], 1)
	out := []fabric.Message{msg(r.Addr(), 1, 0, fabric.MaxVELOPayload)}
	in := make([]fabric.Message, 1)
	ctx := context.Background()
	b.SetBytes(fabric.MaxVELOPayload)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := a.Send(ctx, out); err != nil {
			b.Fatal(err)
		}
		RecvWait(b, ctx, r, in)
	}
}

// echo runs Echo for a benchmark's goroutine and marks it done.
func echo(ep fabric.Endpoint, wg *sync.WaitGroup) {
	defer wg.Done()
	Echo(ep)
}

// Echo receives on ep and sends every message back to its source until
// an operation on ep fails (it is closed): the echo side of every
// ping-pong benchmark, in this process or in a child.
func Echo(ep fabric.Endpoint) {
	buf := make([]fabric.Message, rateBatch)
	ctx := context.Background()
	for {
		k, err := ep.Recv(buf)
		if err != nil {
			return
		}
		if k == 0 {
			if ep.Wait(ctx) != nil {
				return
			}
			continue
		}
		if _, err := ep.Send(ctx, buf[:k]); err != nil {
			return
		}
	}
}

func benchPingPong(b *testing.B, f Factory) {
	nics := f(b, 2)
	a, e := OpenEP(b, nics[0], 1), OpenEP(b, nics[1], 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go echo(e, &wg)
	defer wg.Wait()
	defer e.Close()

	out := []fabric.Message{msg(e.Addr(), 1, 0, fabric.MaxVELOPayload)}
	in := make([]fabric.Message, 1)
	ctx := context.Background()
	lat := make([]int64, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := a.Send(ctx, out); err != nil {
			b.Fatal(err)
		}
		RecvWait(b, ctx, a, in)
		lat[i] = int64(time.Since(t0)) / 2
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
}

// benchRate streams 120 B messages in batches from one goroutine to a
// receiver goroutine on another node; mailbox back-pressure paces it.
func benchRate(b *testing.B, f Factory) {
	nics := f(b, 2)
	a, r := OpenEP(b, nics[0], 1), OpenEP(b, nics[1], 1)
	batch := make([]fabric.Message, rateBatch)
	for i := range batch {
		batch[i] = msg(r.Addr(), 1, uint64(i), fabric.MaxVELOPayload)
	}
	ctx := context.Background()
	done := make(chan error, 1)
	b.SetBytes(fabric.MaxVELOPayload)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	go func() {
		buf := make([]fabric.Message, rateBatch)
		for got := 0; got < b.N; {
			k, err := r.Recv(buf)
			if err != nil {
				done <- err
				return
			}
			got += k
			if k == 0 {
				if err := r.Wait(ctx); err != nil {
					done <- err
					return
				}
			}
		}
		done <- nil
	}()
	for sent := 0; sent < b.N; {
		k := min(rateBatch, b.N-sent)
		if _, err := a.Send(ctx, batch[:k]); err != nil {
			b.Fatal(err)
		}
		sent += k
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
}

// memcpyNs measures a local copy of size bytes, in ns per copy, with enough
// repetitions (about memcpyVolume bytes, at least memcpyMinReps) to be
// stable.
func memcpyNs(size int) float64 {
	const (
		memcpyVolume  = 64 << 20
		memcpyMinReps = 8
	)
	src, dst := make([]byte, size), make([]byte, size)
	fill(src, 3)
	reps := max(memcpyMinReps, memcpyVolume/size)
	copy(dst, src) // fault the pages in
	t0 := time.Now()
	for range reps {
		copy(dst, src)
	}
	return float64(time.Since(t0).Nanoseconds()) / float64(reps)
}

// benchRMA posts one request at a time and waits for its requester
// notification, so each op is a complete transfer.
func benchRMA(b *testing.B, f Factory, op fabric.Op, size int) {
	nics := f(b, 2)
	a, p := OpenEP(b, nics[0], 1), OpenEP(b, nics[1], 1)
	la, rp := Register(b, a, size), Register(b, p, size)
	fill(la.Buf, 1)
	fill(rp.Buf, 2)
	reqs := []fabric.RMA{{Op: op, Peer: p.Addr(), Local: la.NLA, Remote: rp.NLA, Len: uint32(size), Notify: fabric.NotifyRequester}}
	ns := make([]fabric.Notification, 1)
	ctx := context.Background()
	base := memcpyNs(size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := a.Post(reqs); err != nil {
			b.Fatal(err)
		}
		PollWait(b, ctx, a, ns)
		if ns[0].Err != fabric.NErrNone {
			b.Fatalf("rma: %s", describe(ns[0]))
		}
	}
	el := time.Since(start)
	b.StopTimer()
	per := float64(el.Nanoseconds()) / float64(b.N)
	b.ReportMetric(base, "memcpy-ns")
	b.ReportMetric(base/per, "x-memcpy")
}
