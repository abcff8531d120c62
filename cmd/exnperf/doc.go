// Command exnperf runs exn benchmarks. With no arguments it runs the
// embedded demo: an in-process N-node cluster on the mem fabric (no root,
// no TAP), a TCP throughput and a TCP ping-pong latency test for every
// ordered pair of nodes over EXT-Eth on gVisor netstack, printed as a
// table and written as JSON and SVG.
//
//	exnperf [-nodes 4] [-time 1s] [-rtt 2000] [-json FILE] [-svg FILE]
//	exnperf demo [flags]   (the same)
//	exnperf report [-quick] [-out docs] [-from DIR] [-only SECTION,...]
//	                       (the benchmark matrix: docs/benchmarks.md, see perf/report)
//
// # Ownership and imports
//
// cmd/exnperf owns subcommand dispatch and flag parsing. The demo lives in
// perf/demo and the benchmark matrix in perf/report; it may import those
// two, golang.org/x/sys/unix (a terminal check, TCGETS) and the
// standard library.
package main
