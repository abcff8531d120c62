// Package demo is exnperf's embedded default: an in-process N-node cluster
// on the mem fabric (exn/node), a throughput transfer and a ping-pong
// latency test for every ordered pair of nodes, both over TCP on EXT-Eth
// (gVisor netstack) and over EXT-DS (the shadow TCP connection runs on the
// same netstack, the data on the fabric), and the results as a table, JSON
// and an SVG chart.
//
// # Ownership and imports
//
// demo owns the demo's cluster set-up, its measurements and its table,
// JSON and SVG output. It may import exn, exn/node, extds and the
// standard library; only cmd/exnperf imports it.
package demo
