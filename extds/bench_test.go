package extds

import (
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// benchPair returns a connected pair over EXT-DS (mem fabric) or over
// loopback TCP (the baseline).
func benchPair(b *testing.B, kind string) (net.Conn, net.Conn) {
	b.Helper()
	if kind == "extds" {
		p := newPair(b)
		c, s := p.conns(b)
		b.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); ch <- c }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-ch
	b.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// BenchmarkPingPong: one request/response of size bytes per op; reports
// half-round-trip p50/p99 in µs.
func BenchmarkPingPong(b *testing.B) {
	for _, kind := range []string{"extds", "tcp"} {
		for _, size := range []int{1, 64, 1024, 4096} {
			b.Run(fmt.Sprintf("%s/%dB", kind, size), func(b *testing.B) {
				c, s := benchPair(b, kind)
				go func() {
					buf := make([]byte, size)
					for {
						if _, err := io.ReadFull(s, buf); err != nil {
							return
						}
						if _, err := s.Write(buf); err != nil {
							return
						}
					}
				}()
				buf := make([]byte, size)
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0)/2)
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			})
		}
	}
}

// BenchmarkStream: one-way throughput with writes of size bytes.
func BenchmarkStream(b *testing.B) {
	for _, kind := range []string{"extds", "tcp"} {
		for _, size := range []int{64, 4096, 65536, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dB", kind, size), func(b *testing.B) {
				c, s := benchPair(b, kind)
				done := make(chan int64, 1)
				go func() {
					n, _ := io.Copy(io.Discard, s)
					done <- n
				}()
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				if cw, ok := c.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
				if n := <-done; n != int64(size)*int64(b.N) {
					b.Fatalf("received %d of %d", n, size*b.N)
				}
			})
		}
	}
}
