#!/usr/bin/env bash
# Issue #14: unmodified sockperf, iperf3 and netperf TCP_RR through
# libextds.so with direct connections (docs/direct.md), against the relay
# through exnd, TCP over exn0 and TCP over veth, measured in one run. Needs
# root, iproute2, sockperf, iperf3, gcc and the netperf build (make
# netperf). Usage:
#
#   perf/shim-direct.sh [results.md]   (EXN_PERF_REPS=N, default 3; EXN_PERF_SECS=S, default 4)
#
# It runs BenchmarkShimDirect (perf/shimdirect_test.go).
exec "$(dirname "$0")/bench.sh" ShimDirect "$@"
