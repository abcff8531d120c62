#!/usr/bin/env bash
# Shared runner of the perf/ benchmarks that need root (ext-eth.sh and
# extds.sh call it). Usage:
#
#   perf/bench.sh BENCH [results.md]
#
# It builds the perf test binary, runs Benchmark<BENCH> once
# (-benchtime 1x: the benchmark repeats and takes medians itself), and
# copies the markdown table the benchmark writes to EXN_PERF_OUT into
# results.md (default: stdout only). TAGS (e.g. TAGS=ofi) builds the
# test binary, and so the exnd nstest builds for it, with those build
# tags; TIMEOUT is the binary's -test.timeout (default 10m).
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:?usage: perf/bench.sh BENCH [results.md]}
out=${2:-}
. perf/lib.sh

go test ${TAGS:+-tags "$TAGS"} -c -o "$tmp/perf.test" ./perf/
perf_run "$out" "$tmp/perf.test" -test.run '^$' -test.bench "^Benchmark${bench}\$" \
	-test.benchtime 1x -test.timeout "${TIMEOUT:-10m}" -test.v
