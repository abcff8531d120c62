#!/usr/bin/env bash
# The fabric backends measured back to back in one invocation: shm, net
# (loopback TCP), ofi:shm and ofi:tcp (libfabric; needs cgo and
# libfabric-dev), through the shared fabrictest.Bench. Usage:
#
#   perf/fabric-compare.sh [table.md]
#
# Environment: ROUNDS (default 3; the backends are interleaved round by
# round, so a load change on the machine hits all alike, and every cell is
# the median over the rounds), BENCHTIME (go -benchtime, default 500ms),
# RAW (a file to keep the raw `go test -bench` output in). Each benchmark
# binary is bounded by a 120 s timeout; the default run takes about 1.5-2
# minutes on 2 vCPUs (3 rounds at 300ms: under a minute).
#
# Only the sub-benchmarks the table needs run: VELO 120 B ping-pong (p50,
# p99 one-way), VELO 120 B message rate, RMA GET and PUT at 64 KiB and
# 1 MiB (MB/s and the ratio to a memcpy of the same size measured in the
# same run, "x-memcpy").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-}
rounds=${ROUNDS:-3}
benchtime=${BENCHTIME:-500ms}
raw=${RAW:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

backends=(shm net ofi:shm ofi:tcp)
declare -A pkg=([shm]=./fabric/shm [net]=./fabric/fabnet [ofi:shm]=./fabric/ofi [ofi:tcp]=./fabric/ofi)
declare -A top=([shm]=BenchmarkFabric [net]=BenchmarkFabric [ofi:shm]=BenchmarkFabricSHM [ofi:tcp]=BenchmarkFabricTCP)
subs='^(VELO|RMA)$/^(pingpong-120B|rate-120B|get-64KiB|put-64KiB|get-1MiB|put-1MiB)$'

# One test binary per package, built once (with -tags ofi, so fabric/ofi
# has the libfabric backend; the tag changes nothing in shm and net).
declare -A bin
for b in "${backends[@]}"; do
	p=${pkg[$b]}
	name=$(basename "$p")
	if [ ! -x "$tmp/$name.test" ]; then
		go test -c -tags ofi -o "$tmp/$name.test" "$p"
	fi
	bin[$b]=$tmp/$name.test
done

# results: backend <TAB> sub-benchmark <TAB> unit <TAB> value, a line per
# metric per round.
: >"$tmp/results"
for r in $(seq 1 "$rounds"); do
	for b in "${backends[@]}"; do
		echo "round $r/$rounds: $b" >&2
		log=$tmp/$r-${b/:/-}.txt
		# go test runs a test binary in its package directory; so do we.
		# Results go to stdout; the backends' logs (stderr) are kept apart
		# so that a log line cannot split a result line.
		(cd "${pkg[$b]}" && timeout 120 "${bin[$b]}" -test.run '^$' \
			-test.bench "^${top[$b]}\$/$subs" -test.benchtime "$benchtime") >"$log" 2>"$log.err" || {
			echo "$b: benchmark failed (round $r):" >&2
			tail -20 "$log" "$log.err" >&2
			exit 1
		}
		[ -z "$raw" ] || { echo "== round $r $b"; cat "$log" "$log.err"; } >>"$raw"
		# BenchmarkFabricTCP/RMA/get-1MiB-2  123  456 ns/op  789 MB/s ...
		awk -v be="$b" '/^Benchmark/ {
			n = $1; sub(/-[0-9]+$/, "", n); sub(/^[^\/]*\//, "", n)
			for (i = 3; i < NF; i += 2) printf "%s\t%s\t%s\t%s\n", be, n, $(i + 1), $i
		}' "$log" >>"$tmp/results"
	done
done

# The table: a row per measure, a column per backend, medians.
awk -F '\t' -v rounds="$rounds" -v benchtime="$benchtime" -v order="${backends[*]}" '
function med(k,    n, i, j, v, a) {
	n = split(vals[k], a, " ")
	if (n == 0 || vals[k] == "") return ""
	for (i = 2; i <= n; i++) { v = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > v; j--) a[j + 1] = a[j]; a[j + 1] = v }
	return (n % 2) ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2
}
function dur(ns) {
	if (ns == "") return "—"
	if (ns < 1000) return sprintf("%.0f ns", ns)
	if (ns < 1e6) return sprintf("%.1f µs", ns / 1e3)
	return sprintf("%.2f ms", ns / 1e6)
}
function cell(b, row,    sb, v, x) {
	if (row == "p50" || row == "p99") return dur(med(b SUBSEP "VELO/pingpong-120B" SUBSEP row "-ns"))
	if (row == "rate") { v = med(b SUBSEP "VELO/rate-120B" SUBSEP "msgs/s"); return v == "" ? "—" : sprintf("%.0f k msgs/s", v / 1e3) }
	sb = "RMA/" row
	v = med(b SUBSEP sb SUBSEP "MB/s"); x = med(b SUBSEP sb SUBSEP "x-memcpy")
	if (v == "") return "—"
	return sprintf("%.0f MB/s (%.3g×)", v, x)
}
{ k = $1 SUBSEP $2 SUBSEP $3; vals[k] = vals[k] (vals[k] == "" ? "" : " ") $4 }
END {
	nb = split(order, be, " ")
	nr = split("p50 p99 rate get-64KiB put-64KiB get-1MiB put-1MiB", rows, " ")
	label["p50"] = "VELO 120 B ping-pong, one-way p50"
	label["p99"] = "VELO 120 B ping-pong, one-way p99"
	label["rate"] = "VELO 120 B message rate"
	label["get-64KiB"] = "RMA GET 64 KiB (x-memcpy)"
	label["put-64KiB"] = "RMA PUT 64 KiB (x-memcpy)"
	label["get-1MiB"] = "RMA GET 1 MiB (x-memcpy)"
	label["put-1MiB"] = "RMA PUT 1 MiB (x-memcpy)"
	printf "| benchmark (median of %d, -benchtime %s) |", rounds, benchtime
	for (i = 1; i <= nb; i++) printf " %s |", be[i]
	printf "\n|---|"
	for (i = 1; i <= nb; i++) printf "---:|"
	printf "\n"
	for (r = 1; r <= nr; r++) {
		printf "| %s |", label[rows[r]]
		for (i = 1; i <= nb; i++) printf " %s |", cell(be[i], rows[r])
		printf "\n"
	}
}' "$tmp/results" >"$tmp/table.md"

{
	echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
	echo
	cat "$tmp/table.md"
} >"$tmp/report.md"
[ -z "$out" ] || cp "$tmp/report.md" "$out"
cat "$tmp/report.md"
