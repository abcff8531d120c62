// Package demo is exnperf's embedded default: an in-process N-node cluster
// on the mem fabric (exn/node), a throughput transfer and a ping-pong
// latency test for every ordered pair of nodes, both over TCP on EXT-Eth
// (gVisor netstack) and over EXT-DS (the shadow TCP connection runs on the
// same netstack, the data on the fabric), and the results as a table, JSON
// and an SVG chart.
//
// # Ownership and imports
//
// demo owns the demo's cluster set-up, its measurements and its table and
// JSON output, and what its chart shows; perf/svgchart, the chart writer
// it shares with perf/report, draws it. It may import exn, exn/node,
// extds, perf/svgchart and the standard library; only cmd/exnperf imports
// it.
package demo
