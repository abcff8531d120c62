package metrics

import (
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/tap"
	"github.com/prometheus/client_golang/prometheus"
)

// TAP returns a collector for a TAP device's counters, labelled with the
// node ID and interface name. rx is host to fabric (frames exnd read), tx
// fabric to host (frames exnd wrote). stats is called once per scrape
// (tap.TAP.Stats fits).
func TAP(node fabric.NodeID, ifname string, stats func() tap.Stats) prometheus.Collector {
	type S = tap.Stats
	b := nodeBuilder[S]("tap", node, "ifname", ifname)
	b.counterDir("frames_total", "Frames read from (rx) and written to (tx) the TAP.", rxTx, func(s *S) uint64 { return s.RxFrames }, func(s *S) uint64 { return s.TxFrames })
	b.counterDir("bytes_total", "Frame bytes read from (rx) and written to (tx) the TAP.", rxTx, func(s *S) uint64 { return s.RxBytes }, func(s *S) uint64 { return s.TxBytes })
	b.counterDir("errors_total", "TAP read errors (rx) and frames the kernel refused (tx).", rxTx, func(s *S) uint64 { return s.RxErrors }, func(s *S) uint64 { return s.TxErrors })
	b.counter("short_buffer_drops_total", "Frames dropped because they were longer than the read buffer.", func(s *S) uint64 { return s.ShortBuffer })
	b.counter("bad_vnet_drops_total", "Frames dropped because their virtio-net header was short or not understood.", func(s *S) uint64 { return s.BadVnet })
	b.counter("gso_drops_total", "Super-frames dropped by a read without virtio-net headers.", func(s *S) uint64 { return s.GSODropped })
	return b.collector(stats)
}
