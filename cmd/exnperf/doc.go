// Command exnperf runs exn benchmarks. With no arguments it runs the
// embedded demo: an in-process N-node cluster on the mem fabric (no root,
// no TAP), a throughput and a ping-pong latency test per ordered pair of
// nodes, over TCP on EXT-Eth (gVisor netstack) and over EXT-DS, printed
// as a table with the distribution across pairs and written as JSON and
// SVG. Up to -all-pairs nodes (8) it measures every pair; beyond, the
// ring i -> i+1 and -peers (2) random peers per node (-seed), with the
// tests scaled down to fit -budget (see perf/demo.Sampling).
//
//	exnperf [-nodes 4] [-time 1s] [-rtt 2000] [-all-pairs 8] [-peers 2]
//	        [-seed 1] [-budget 2m] [-json FILE] [-svg FILE]
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
