// Package ratelog rate-limits log lines for events that can happen once
// per packet: at most Burst lines per Period, and the next line that is
// let through says how many were suppressed in between.
//
// It is the one way exn logs per-packet and per-request faults:
//
//   - Faults is an owner's fault log (a NIC, a node): Init it with the
//     logger, the period and the owner's attributes, then call Warn for
//     each fault after counting it. fabric/mem, fabric/shm and
//     fabric/fabnet use one per NIC.
//   - Limiter is the primitive: Allow, Log at any level, Warn with
//     slog.Attr values. Its zero value allows one line a second.
//
// # Ownership and imports
//
// ratelog owns the rate-limiting policy and nothing else: counting a fault
// stays with its caller (its stats struct). It imports only the standard
// library and may be imported by any package of exn.
package ratelog
