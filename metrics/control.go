package metrics

import (
	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric"
	"github.com/prometheus/client_golang/prometheus"
)

// Control returns a collector for exnd's control socket counters
// (control.Server.Stats): connections, requests, and refusals by reason.
func Control(node fabric.NodeID, stats func() control.ServerStats) prometheus.Collector {
	type S = control.ServerStats
	b := nodeBuilder[S]("control", node)
	b.counter("connections_total", "Control socket connections accepted.", func(s *S) uint64 { return s.Accepted })
	b.gauge("active_connections", "Control socket connections open now.", func(s *S) float64 { return float64(s.Active) })
	b.counter("requests_total", "Control request lines answered.", func(s *S) uint64 { return s.Requests })
	b.counterMap("refused_total", "Control connections or requests refused, by reason (unauthorized, oversized, truncated, idle, too_many_conns, too_many_fds, bad_request, failed, no_peer_cred).", "reason", func(s *S) map[string]uint64 { return s.Refused })
	return b.collector(stats)
}

// Shim returns a collector for exnd's shim server (libextds.so) counters:
// connections switched onto EXT-DS, fallbacks to plain TCP and refusals,
// each by reason.
func Shim(node fabric.NodeID, stats func() shimsrv.Stats) prometheus.Collector {
	type S = shimsrv.Stats
	b := nodeBuilder[S]("shim", node)
	b.counter("switched_total", "Shimmed connections spliced onto EXT-DS.", func(s *S) uint64 { return s.Switched })
	b.counterMap("fallbacks_total", "Shimmed connections left as plain TCP, by reason (the decline codes of docs/extds.md).", "reason", func(s *S) map[string]uint64 { return s.Fallbacks })
	b.counterMap("refused_total", "Shim requests refused, by reason (not_owner, not_listening, bad_request, ...).", "reason", func(s *S) map[string]uint64 { return s.Refused })
	b.counter("errors_total", "shim-connect/shim-accept operations that failed.", func(s *S) uint64 { return s.Errors })
	b.gauge("active_connections", "Switched shim connections open now.", func(s *S) float64 { return float64(s.Active) })
	b.gauge("listeners", "Listener registrations.", func(s *S) float64 { return float64(s.Listens) })
	b.counterDir("bytes_total", "Bytes spliced, by direction: in (fabric to application), out.", inOut, func(s *S) uint64 { return s.BytesIn }, func(s *S) uint64 { return s.BytesOut })
	b.counter("relayed_total", "Shimmed connections whose bytes exnd relays (no direct connection: a net or ofi fabric, a peer or program that did not ask for one, EXTDS_DIRECT=0). Included in switched_total.", func(s *S) uint64 { return s.Switched - s.DirectConns })
	b.counter("direct_total", "Shimmed connections made direct: the programs move the bytes through a shared buffer, exnd is not in the data path (docs/direct.md). Included in switched_total.", func(s *S) uint64 { return s.DirectConns })
	b.gauge("direct_active_connections", "Direct connections open now.", func(s *S) float64 { return float64(s.DirectActive) })
	b.counter("direct_relays_total", "Direct connections handed to exnd's relay (a program exec'd with one open).", func(s *S) uint64 { return s.DirectRelays })
	b.counterDir("direct_bytes_total", "Bytes the programs moved over direct connections, by direction (read from the buffers' cursors; included in bytes_total).", inOut, func(s *S) uint64 { return s.DirectBytesIn }, func(s *S) uint64 { return s.DirectBytesOut })
	return b.collector(stats)
}

// AttachStats are exnd's kernel-bypass lease counters (extds-attach and
// friends; cmd/exnd's attach service converts its own into these).
type AttachStats struct {
	Attached, Detached, Reclaimed, Expired, Refused, Listens uint64
	Leases                                                   int
}

// Attach returns a collector for exnd's kernel-bypass lease service.
func Attach(node fabric.NodeID, stats func() AttachStats) prometheus.Collector {
	type S = AttachStats
	b := nodeBuilder[S]("attach", node)
	b.counter("granted_total", "VPID leases granted (extds-attach).", func(s *S) uint64 { return s.Attached })
	b.counter("detached_total", "Leases given back (extds-detach).", func(s *S) uint64 { return s.Detached })
	b.counter("reclaimed_total", "Leases ended because the holder let go or died.", func(s *S) uint64 { return s.Reclaimed })
	b.counter("expired_total", "Leases never attached (the caller died, or the grace passed).", func(s *S) uint64 { return s.Expired })
	b.counter("refused_total", "Lease requests refused: bad arguments, another process's or user's lease, no block free; listings that withheld other users' leases.", func(s *S) uint64 { return s.Refused })
	b.counter("listens_total", "extds-listen registrations.", func(s *S) uint64 { return s.Listens })
	b.gauge("leases", "Leases held now.", func(s *S) float64 { return float64(s.Leases) })
	return b.collector(stats)
}
