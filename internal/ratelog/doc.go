// Package ratelog rate-limits log lines for events that can happen once
// per packet: at most Burst lines per Period, and the next line that is
// let through says how many were suppressed in between.
//
// # Ownership and imports
//
// ratelog owns the rate-limiting policy and nothing else: counting a fault
// stays with its caller (its stats struct). It imports only the standard
// library (log/slog, sync, time) and may be imported by any package of
// exn.
package ratelog
