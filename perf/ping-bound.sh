#!/usr/bin/env bash
# Issue #35's ping bar against what any user-space TAP gateway pays on
# this machine: ping p50 (200 echoes 10 ms apart) between two namespaces
# on one underlay bridge over the underlay, over exn0 (exnd on the net
# fabric), and through the smallest TAP relays: C with blocking reads, Go
# parked in the netpoller, and C spinning (perf/testdata/tap_relay.c,
# perf/testdata/gorelay); and after each way's pings sockperf's TCP
# ping-pong (64 B) over it. Needs root, iproute2, ping, sockperf and gcc.
# Usage:
#
#   flock /tmp/exn-bench.lock perf/ping-bound.sh [results.md]
#       (EXN_PERF_REPS=N, default 3; EXN_PERF_SECS=S per sockperf, default 4)
#
# It runs BenchmarkPingBound (perf/pingbound_test.go).
export TIMEOUT=${TIMEOUT:-20m}
exec "$(dirname "$0")/bench.sh" PingBound "$@"
