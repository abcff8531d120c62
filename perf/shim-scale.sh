#!/usr/bin/env bash
# Issue #32: the shim with many connections (docs/direct.md
# "Descriptors"): an epoll echo server and its client under libextds.so
# with 0 and 1,000 idle direct connections beside a busy one, against
# kernel TCP over veth, and what each connection costs in descriptors,
# exnd memory and /dev/shm. Needs root, iproute2 and gcc. Usage:
#
#   flock /tmp/exn-bench.lock perf/shim-scale.sh [results.md]
#       (EXN_PERF_REPS=N, default 3)
#
# It runs BenchmarkShimScale (perf/shimscale_test.go).
exec "$(dirname "$0")/bench.sh" ShimScale "$@"
