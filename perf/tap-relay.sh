#!/usr/bin/env bash
# Issue #35's throughput bars against the smallest user-space TAP
# gateways of exn0's two shapes (perf/testdata/tap_fwd.c): on one host a
# single process copying frames between a TAP in each namespace, between
# hosts a TAP relayed over one TCP connection on the underlay, each
# measured interleaved with the kernel's path and exn0 (iperf3 1 stream,
# -P 4, MTU 1500; sockperf 64 B p50). Needs root, iproute2, gcc, iperf3
# and sockperf. Usage:
#
#   flock /tmp/exn-bench.lock perf/tap-relay.sh [results.md]
#       (EXN_PERF_REPS=N, default 3; EXN_PERF_SECS=S per run, default 4;
#        TAGS=ofi adds ofi:tcp, which needs libfabric-dev)
#
# It runs BenchmarkTAPRelay (perf/taprelay_test.go).
export TIMEOUT=${TIMEOUT:-30m}
exec "$(dirname "$0")/bench.sh" TAPRelay "$@"
