#!/usr/bin/env bash
# EXT-DS performance against TCP over exn0 and TCP over veth, measured in
# one run (issue #5). Needs root and iproute2. Usage:
#
#   perf/extds.sh [results.md]     (EXN_PERF_REPS=N repetitions, default 3;
#                                   EXN_PERF_DS_COPY=1: streams through io.Copy;
#                                   EXN_PERF_DS_HASH=1: the server sha256-hashes streams;
#                                   EXN_PERF_DS_CPUPROFILE=DIR: CPU profiles of the app processes)
#
# It runs BenchmarkExtDS (perf/extds_test.go): two namespaces with one exnd
# each on a shm fabric, an application process attached to each exnd
# (EXT-DS kernel bypass), the same Go client and server over TCP on exn0
# and over a veth pair between two more namespaces; ping-pong 1 B..4 KiB
# and streams of 64 B..1 MiB writes, the variants interleaved per
# repetition. The markdown table goes to results.md (default: stdout only).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-}
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
EXN_PERF_OUT="$tmp/table.md" "$tmp/perf.test" -test.run '^$' -test.bench 'ExtDS' \
	-test.benchtime 1x -test.timeout 10m -test.v &
pid=$!
wait "$pid"
pid=
if [ -n "$out" ]; then
	cp "$tmp/table.md" "$out"
fi
echo
cat "$tmp/table.md"
