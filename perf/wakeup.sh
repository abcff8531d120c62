#!/usr/bin/env bash
# The wake-up design (docs/wakeup.md) against veth, measured in one run.
# Needs root, ping and sockperf. Usage:
#
#   perf/wakeup.sh [results.md]        (EXN_PERF_SECS=N for sockperf, default 4)
#
# It runs BenchmarkWakeup (perf/wakeup_test.go): ping over exn0 at 1, 5
# and 50/s, exnctl ping cold and warm, sockperf 64 B ping-pong, and each
# exnd's idle CPU share; then BenchmarkWakeupIdleScale (2 and 32 idle
# nodes on one fabric). The markdown tables go to results.md (default:
# stdout only).
set -euo pipefail
dir=$(dirname "$0")
out=${1:-}
"$dir/bench.sh" Wakeup "${out:+$out.wakeup}"
"$dir/bench.sh" WakeupIdleScale "${out:+$out.scale}"
if [ -n "$out" ]; then
	cat "$out.wakeup" "$out.scale" >"$out"
	rm -f "$out.wakeup" "$out.scale"
fi
