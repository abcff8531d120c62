// Package demo is exnperf's embedded default: an in-process N-node cluster
// on the mem fabric (exn/node), a throughput transfer and a ping-pong
// latency test per ordered pair of nodes, both over TCP on EXT-Eth
// (gVisor netstack) and over EXT-DS (the shadow TCP connection runs on the
// same netstack, the data on the fabric), and the results as a table, JSON
// and an SVG chart.
//
// Small clusters measure every ordered pair; large ones a sample (the
// ring and a few seeded random peers per node, see Sampling), one test at
// a time, with the test sizes scaled to a time budget (PlanTests). The
// result carries the distribution across pairs (Summary), how many pairs
// were measured of how many (SamplingInfo) and the CPUs and load average
// (Machine), so a reader can judge the noise.
//
// # Ownership and imports
//
// demo owns the demo's cluster set-up, its measurements and its table and
// JSON output, and what its chart shows; perf/svgchart, the chart writer
// it shares with perf/report, draws it. It may import exn, exn/node,
// extds, perf/svgchart and the standard library; only cmd/exnperf imports
// it.
package demo
