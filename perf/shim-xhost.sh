#!/usr/bin/env bash
# Issue #38: the shim's direct connections across hosts (docs/direct.md
# "Across hosts"), on the net and ofi:tcp fabrics: unmodified sockperf,
# iperf3 and netperf TCP_RR from one node namespace to another over the
# underlay (kernel TCP), over exn0, through libextds.so with the relay
# and with direct connections, in one run; on ofi:tcp also fi_pingpong
# over the underlay; then the exnds' idle CPU with 100 direct
# connections open. Needs root, iproute2, sockperf, iperf3, gcc, the
# netperf build (make netperf), libfabric-dev and libfabric-bin
# (fi_pingpong). Usage:
#
#   flock /tmp/exn-bench.lock perf/shim-xhost.sh [results.md]
#       (EXN_PERF_REPS=N, default 3; EXN_PERF_SECS=S, default 4;
#        TAGS= builds without ofi: the ofi:tcp half is then skipped)
#
# It runs BenchmarkShimXHost (perf/shimxhost_test.go) with -tags ofi.
export TAGS=${TAGS-ofi} TIMEOUT=${TIMEOUT:-30m}
exec "$(dirname "$0")/bench.sh" ShimXHost "$@"
