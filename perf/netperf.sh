#!/usr/bin/env bash
# netperf (the seed's benchmark, issue #15) through libextds.so against
# TCP over exn0 and TCP over veth, in one run. Needs root, iproute2, gcc
# and the netperf build (make netperf, or EXN_NETPERF_DIR). Usage:
#
#   perf/netperf.sh [results.md]   (EXN_PERF_REPS=N repetitions, default 3;
#                                   EXN_PERF_SECS=S netperf -l, default 4)
#
# It runs BenchmarkNetperf (perf/netperf_test.go): two namespaces with one
# exnd each on a shm fabric and a veth pair between them; TCP_RR, TCP_CRR
# and TCP_STREAM over veth, over exn0 and shimmed at both ends, the ways
# interleaved per repetition; medians, RR latency P50/P90/P99 and ratios.
# The markdown table goes to results.md (default: stdout only).
export EXN_NETPERF_DIR=${EXN_NETPERF_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/netperf}
exec "$(dirname "$0")/bench.sh" Netperf "$@"
