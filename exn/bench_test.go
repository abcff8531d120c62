package exn

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// discardLink counts frames and wakes the benchmark when it has seen
// enough, without copying (the Link copy is the TAP's cost, not ours).
type discardLink struct {
	n      int64
	target int64
	done   chan struct{}
}

func (l *discardLink) DeliverFrames(fs [][]byte) error {
	l.n += int64(len(fs))
	if l.target > 0 && l.n >= l.target {
		l.target = 0
		l.done <- struct{}{}
	}
	return nil
}

// BenchmarkTransmit: two engines on fabric/mem, frames of each size from
// A to B in batches of benchBatch, measured to delivery at B's Link, by
// advert and GET and, for rendezvous sizes, with push on (exn-push). The
// memcpy sub-benchmark copies the same bytes once in the same run; the
// ratio metric is engine throughput / memcpy throughput.
func BenchmarkTransmit(b *testing.B) {
	const benchBatch = 32
	for _, size := range []int{64, 480, 1500, 9000, 65535 + 14} {
		var memcpyNs float64
		b.Run(fmt.Sprintf("memcpy/%d", size), func(b *testing.B) {
			src, dst := make([]byte, size), make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				copy(dst, src)
			}
			memcpyNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
		for _, mode := range []struct {
			name string
			push bool
		}{{"exn", false}, {"exn-push", true}} {
			if mode.push && size <= DefaultEagerThreshold {
				continue // eager frames never push
			}
			b.Run(fmt.Sprintf("%s/%d", mode.name, size), func(b *testing.B) {
				transmitRounds(b, Config{MTU: MaxMTU, Push: mode.push}, size, benchBatch, func(a *node, f []byte) func(k int) {
					batch := make([][]byte, benchBatch)
					for i := range batch {
						batch[i] = f
					}
					ctx := context.Background()
					return func(k int) {
						if _, err := a.eng.Transmit(ctx, batch[:k]); err != nil {
							b.Fatal(err)
						}
					}
				})
				perFrame := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
				b.ReportMetric(1e9/perFrame, "frames/s")
				if memcpyNs > 0 {
					b.ReportMetric(memcpyNs/perFrame, "x-memcpy")
				}
			})
		}
	}
}

// transmitRounds runs a transmit benchmark: node a sends to rx over
// fabric/mem, both with cfg, rx's Link a discardLink. newRound gets a and a frame f of size
// bytes from a to rx and returns the function that sends k (at most batch)
// frames. transmitRounds warms the pools and the scratch with 4 batches,
// then times b.N frames to their delivery at rx's Link (the timer stopped
// on return) and fails on any drop at rx.
func transmitRounds(b *testing.B, cfg Config, size, batch int, newRound func(a *node, f []byte) func(k int)) {
	l := &discardLink{done: make(chan struct{}, 1)}
	ns := benchNodes(b, cfg, l)
	a, rx := ns[0], ns[1]
	round := newRound(a, frame(rx.eng.MAC(), a.eng.MAC(), size, 1))
	warm := int64(4 * batch)
	l.target = warm
	for i := int64(0); i < warm; i += int64(batch) {
		round(batch)
	}
	<-l.done
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	l.target = l.n + int64(b.N)
	for sent := 0; sent < b.N; sent += batch {
		round(min(batch, b.N-sent))
	}
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		b.Fatal("frames not delivered")
	}
	b.StopTimer()
	if d := rx.eng.Stats().TotalDrops(); d != 0 {
		b.Fatalf("%d drops", d)
	}
}

// BenchmarkTAPPath models the daemon's TAP reader: each frame is first
// written into a buffer (the TAP read's copy), then handed to the engine.
// "copy" reads into private buffers and calls Transmit (which copies a
// rendezvous frame into a tx slot); "lent" reads into slots from Lend and
// calls TransmitLent (no engine copy). Same run, same sizes: the ratio of
// the two is what zero-copy transmit saves on the engine side.
func BenchmarkTAPPath(b *testing.B) {
	const benchBatch = 32
	for _, size := range []int{480, 1500, 9000, 65535 + 14} {
		for _, mode := range []string{"copy", "lent"} {
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) {
				transmitRounds(b, Config{MTU: MaxMTU}, size, benchBatch, func(a *node, f []byte) func(k int) {
					private := make([][]byte, benchBatch)
					for i := range private {
						private[i] = make([]byte, a.eng.maxFrame)
					}
					bufs := make([][]byte, benchBatch)
					frames := make([][]byte, benchBatch)
					ctx := context.Background()
					var round func(k int)
					round = func(k int) {
						if mode == "copy" {
							for i := range k {
								frames[i] = private[i][:copy(private[i], f)]
							}
							if _, err := a.eng.Transmit(ctx, frames[:k]); err != nil {
								b.Fatal(err)
							}
							return
						}
						got := 0
						for got < k {
							n, err := a.eng.Lend(ctx, bufs[got:k], got == 0)
							if err != nil {
								b.Fatal(err)
							}
							if n == 0 {
								break
							}
							got += n
						}
						for i := range got {
							frames[i] = bufs[i][:copy(bufs[i], f)]
						}
						if _, err := a.eng.TransmitLent(ctx, frames[:got]); err != nil {
							b.Fatal(err)
						}
						if got < k {
							round(k - got)
						}
					}
					return round
				})
			})
		}
	}
}
