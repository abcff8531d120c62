#!/usr/bin/env bash
# The mid-stream upgrade (issue #33, docs/shim.md "Upgrade") against TCP
# over exn0, in one run. Needs root, iproute2, gcc and the netperf build
# (make netperf, or EXN_NETPERF_DIR). Usage:
#
#   perf/shim-upgrade.sh [results.md]   (EXN_PERF_REPS=N repetitions,
#                                        default 3; EXN_PERF_SECS=S
#                                        netperf -l, default 4)
#
# It runs BenchmarkShimUpgrade (perf/upgrade_test.go): two namespaces
# with one exnd each on a shm fabric (holds off), netserver and netperf
# under libextds.so with EXTDS_SETUP=upgrade and without the shim:
# TCP_CRR, TCP_RR right after it, and a TCP_RR opened during a TCP_CRR
# burst; medians and ratios.
export EXN_NETPERF_DIR=${EXN_NETPERF_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/netperf}
exec "$(dirname "$0")/bench.sh" ShimUpgrade "$@"
