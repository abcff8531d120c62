package shimsrv

// What exnd's part of a direct connection's setup costs on this machine
// (issue #15, docs/shim.md "Where TCP_CRR's time goes"), step by step,
// beside a baseline measured in the same run: a loopback TCP connect and
// accept, the kernel's own cost of a connection.
//
//	go test -run '^$' -bench BenchmarkDirectSetup -benchtime 2000x ./extds/shimsrv/

import (
	"net"
	"testing"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/extds/dring"
	"github.com/exn-project/exn/internal/testenv"
)

func BenchmarkDirectSetup(b *testing.B) {
	dir := b.TempDir()
	s := New(nil, nil, nil, WithDirect(DirectConfig{Fabric: "bench", Dir: dir, Node: 1, Ring: 1 << 20}))
	defer s.Close()
	ln := testenv.ListenTCP(b)
	b.Run("baseline-tcp-connect-accept", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			a, err := ln.Accept()
			if err != nil {
				b.Fatal(err)
			}
			a.Close()
			c.Close()
		}
	})
	// create: what the pool takes off the accepting side's path.
	b.Run("create-buffer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			p, err := s.makeBuf()
			if err != nil {
				b.Fatal(err)
			}
			p.fs.Close()
			if err := dring.Remove(dir, p.name); err != nil {
				b.Fatal(err)
			}
		}
	})
	// open: the connecting side's step between CLAIM_DIRECT and COMMIT
	// (the buffer and the connect of side 0's bell); accept: the
	// accepting side's on COMMIT. A listener takes one connection: each
	// iteration opens a fresh buffer, made with the timer stopped.
	b.Run("open-and-accept", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			b.StopTimer()
			p, err := s.makeBuf()
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			fs := mustOpen(b, dir, p.name)
			if err := p.fs.Accept(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			fs.Close()
			p.fs.Close()
			_ = dring.Remove(dir, p.name)
			b.StartTimer()
		}
	})
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	a, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	// prepare: the program's descriptors and exnd's endpoint, each side.
	b.Run("prepare-and-discard", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			b.StopTimer()
			p, err := s.makeBuf()
			if err != nil {
				b.Fatal(err)
			}
			fs := mustOpen(b, dir, p.name)
			_ = dring.Remove(dir, p.name)
			p.fs.Close()
			b.StartTimer()
			dp, err := s.prepareDirect(fs, &extds.DirectInfo{Node: 2}, c.LocalAddr(), c.RemoteAddr(), control.Peer{}, sideConnect, nil)
			if err != nil {
				b.Fatal(err)
			}
			dp.discard(false)
		}
	})
}

// mustOpen opens buffer name in dir, as the connecting exnd does, or
// ends the benchmark.
func mustOpen(tb testing.TB, dir, name string) *dring.Files {
	tb.Helper()
	fs, err := dring.Open(dir, name)
	if err != nil {
		tb.Fatal(err)
	}
	return fs
}
