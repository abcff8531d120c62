#!/usr/bin/env bash
# EXT-Eth performance against a veth baseline, measured in one run.
# Needs root, /dev/net/tun, iperf3 and sockperf. Usage:
#
#   perf/ext-eth.sh [results.md]        (EXN_PERF_SECS=N per tool run, default 4)
#
# It runs BenchmarkExtEth (perf/exteth_test.go): two namespaces joined by
# a veth pair, two more running exnd on one shm fabric, iperf3 with 1 and
# 2 streams and sockperf ping-pong over both, and exnd's idle CPU. The
# markdown table goes to results.md (default: stdout only).
exec "$(dirname "$0")/bench.sh" ExtEth "$@"
