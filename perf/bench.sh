#!/usr/bin/env bash
# Shared runner of the perf/ benchmarks that need root (ext-eth.sh and
# extds.sh call it). Usage:
#
#   perf/bench.sh BENCH [results.md]
#
# It builds the perf test binary, runs Benchmark<BENCH> once
# (-benchtime 1x: the benchmark repeats and takes medians itself), and
# copies the markdown table the benchmark writes to EXN_PERF_OUT into
# results.md (default: stdout only).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:?usage: perf/bench.sh BENCH [results.md]}
out=${2:-}
tmp=$(mktemp -d)
pid=
cleanup() {
	# The test binary tears down its own namespaces, processes and shm
	# files on exit and on SIGINT/SIGTERM; make sure it got the signal,
	# and sweep whatever a hard kill left behind.
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	for ns in $(ip netns list 2>/dev/null | awk '/^exnt-/{print $1}'); do
		owner=${ns#exnt-}; owner=${owner%%-*}
		if ! kill -0 "$owner" 2>/dev/null; then
			ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
			ip netns del "$ns" 2>/dev/null || true
		fi
	done
	for f in /dev/shm/exn-exnt_*; do
		[ -e "$f" ] || continue
		owner=${f#/dev/shm/exn-exnt_}; owner=${owner%%_*}
		kill -0 "$owner" 2>/dev/null || rm -f "$f"
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

go test -c -o "$tmp/perf.test" ./perf/
EXN_PERF_OUT="$tmp/table.md" "$tmp/perf.test" -test.run '^$' -test.bench "^Benchmark${bench}\$" \
	-test.benchtime 1x -test.timeout 10m -test.v &
pid=$!
wait "$pid"
pid=
if [ -n "$out" ]; then
	cp "$tmp/table.md" "$out"
fi
echo
cat "$tmp/table.md"
