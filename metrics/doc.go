// Package metrics exposes exn's counters to Prometheus.
//
// Counters live in atomic stats structs inside each layer (fabric.Counters,
// the EXT-Eth engine, the TAP, the neighbour table, EXT-DS). Nothing here
// counts anything: each Collector takes a snapshot function and reads it
// once per scrape, so the hot path never touches Prometheus.
//
// Registry builds a private registry (never the global default) with the Go
// and process collectors; Handler serves it. Every metric is prefixed
// "exn_", counters end in "_total", and units are base units (bytes,
// seconds). The package test lints the exposition with promlint.
//
// # Ownership and imports
//
// metrics owns metric names, help texts, types and the HTTP handler; the
// numbers belong to the layers. It may import the packages whose stats
// snapshots it exports (fabric, exn, tap, arp, extds, extds/shimsrv,
// control), internal/ratelog, the Prometheus client and the standard
// library. Only the daemon imports it.
package metrics
