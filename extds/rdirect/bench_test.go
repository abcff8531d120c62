package rdirect

import (
	"io"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/dring"
)

// BenchmarkPingPong: program A writes 64 bytes, program B (another node)
// reads them and writes 64 back, A reads them: one op is a round trip
// through both engines (PUT + CDC each way). Allocations are the whole
// process's: both programs, both engines, the fabric.
func BenchmarkPingPong(b *testing.B) {
	benchSpin(b, 0)
}

// BenchmarkSpin is BenchmarkPingPong with other spin budgets of the
// engines (the programs keep dring.SpinBudget): the measurement behind
// SpinBudget.
func BenchmarkSpin(b *testing.B) {
	for _, spin := range []time.Duration{-1, 5 * time.Microsecond, 20 * time.Microsecond, 50 * time.Microsecond, 200 * time.Microsecond} {
		name := spin.String()
		if spin < 0 {
			name = "none"
		}
		b.Run("pingpong/"+name, func(b *testing.B) { benchSpin(b, spin) })
		b.Run("stream/"+name, func(b *testing.B) { benchStream(b, spin, 64<<10) })
		b.Run("stream64/"+name, func(b *testing.B) { benchStream(b, spin, 64) })
	}
}

func benchSpin(b *testing.B, spin time.Duration) {
	cl := newCluster(b, modeOrdered, func(_ *cluster, _ int, c *Config) { c.Spin = spin })
	p := cl.dial(b, dring.DefaultRing)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		for {
			if err := readFull(p.b.prog, buf); err != nil {
				done <- err
				return
			}
			if _, err := p.b.prog.Write(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	msg := make([]byte, 64)
	in := make([]byte, 64)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		msg[0] = byte(i)
		if _, err := p.a.prog.Write(msg); err != nil {
			b.Fatal(err)
		}
		if err := readFull(p.a.prog, in); err != nil {
			b.Fatal(err)
		}
		if in[0] != byte(i) {
			b.Fatal("wrong echo")
		}
	}
	b.StopTimer()
	s := cl.eng[1].Stats()
	b.ReportMetric(float64(s.Wakes)/float64(b.N), "wakes/op")
	p.a.prog.CloseWrite()
	if err := <-done; err != io.EOF {
		b.Fatal(err)
	}
}

// BenchmarkStream: program A writes 64 KiB per op into a 1 MiB ring,
// program B on the other node reads it all.
func BenchmarkStream(b *testing.B) { benchStream(b, 0, 64<<10) }

func benchStream(b *testing.B, spin time.Duration, size int) {
	cl := newCluster(b, modeOrdered, func(_ *cluster, _ int, c *Config) { c.Spin = spin })
	p := cl.dial(b, dring.DefaultRing)
	done := make(chan error, 1)
	buf := make([]byte, 256<<10)
	go func() {
		for {
			if _, err := p.b.prog.Read(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	msg := make([]byte, size)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.a.prog.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
	p.a.prog.CloseWrite()
	if err := <-done; err != io.EOF {
		b.Fatal(err)
	}
	b.StopTimer()
	s := cl.eng[1].Stats()
	b.ReportMetric(float64(s.CDCsSent)/float64(b.N), "cdcs/op")
	b.ReportMetric(float64(s.Wakes)/float64(b.N), "wakes/op")
}
