#!/usr/bin/env bash
# exn0 with TAP offloads (issue #20) against the build before them and the
# kernel's path, measured interleaved in one run. Needs root,
# /dev/net/tun, iperf3 and git. Usage:
#
#   perf/offload.sh [results.md]   (EXN_PERF_SECS per run, default 4; EXN_PERF_REPS, default 3;
#                                   EXN_OFFLOAD_BASE: the "before" commit, default 9fff62a)
#
# It builds exnd at EXN_OFFLOAD_BASE into a temporary worktree, then runs
# BenchmarkOffload (perf/offload_test.go) through perf/bench.sh with that
# binary as EXN_OFFLOAD_BEFORE. Run it under the benchmark lock:
#
#   flock /tmp/exn-bench.lock perf/offload.sh
set -euo pipefail
cd "$(dirname "$0")/.."
base=${EXN_OFFLOAD_BASE:-9fff62a}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach "$tmp/src" "$base" >/dev/null
(cd "$tmp/src" && go build -o "$tmp/exnd-before" ./cmd/exnd)
EXN_OFFLOAD_BEFORE="$tmp/exnd-before" perf/bench.sh Offload "$@"
