#!/usr/bin/env bash
# EXT-Eth over the net fabric against its own underlay, measured in one
# run. Needs root, /dev/net/tun, iperf3 (and perf for profiles). Usage:
#
#   perf/ext-eth-net.sh [results.md] [profile-dir]   (EXN_PERF_SECS=N per run, default 3)
#
# It runs TestNetPerf (integration/net_test.go): two namespaces on an
# underlay bridge, exnd --fabric net in each, iperf3 with 1 stream over
# exn0 and over the underlay, 3 runs each interleaved, medians, bar 0.5x,
# and the CPU time both exnd used per GB over exn0 (user+system, from
# /proc): the efficiency of the data path, which the load of other
# processes on a shared machine moves far less than the throughput.
# With a profile-dir, `perf record -g` of both exnd and of the whole
# system during the third exn0 run go there (perf report -i DIR/exnd-1.data).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-}
prof=${2:-}
. perf/lib.sh

[ -n "$prof" ] && mkdir -p "$prof"
go test -c -o "$tmp/integration.test" ./integration/
EXN_PERF=1 EXN_PERF_PROFILE="$prof" perf_run "$out" "$tmp/integration.test" \
	-test.run '^TestNetPerf$' -test.timeout 5m -test.v
