// Package fabrictest is the conformance suite and benchmark set every
// fabric backend runs.
//
// A backend's test calls Run with a Factory that builds n NICs of one fresh
// fabric, and Bench with the same Factory:
//
//	func TestConformance(t *testing.T) { fabrictest.Run(t, factory) }
//	func BenchmarkFabric(b *testing.B) { fabrictest.Bench(b, factory) }
//
// The suite assumes only the fabric contract: it never relies on a mailbox
// size, on synchronous completion, or on a backend being in one process. It
// discovers back-pressure through Stats().SendBlocked, and proves that a
// message was NOT delivered by sending a unicast marker behind it from the
// same endpoint (per-pair order makes the marker arrive after it).
//
// # Ownership and imports
//
// fabrictest owns the conformance suite and benchmarks, not any backend's
// own tests. It may import fabric, internal/testenv, internal/bytesize
// (the sizes in the benchmarks' names), golang.org/x/sys/unix (the
// caller-owned mappings of the BufferRegistrar cases) and the standard
// library (never a backend: backends import it, from their tests).
package fabrictest
