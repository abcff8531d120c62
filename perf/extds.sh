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
exec "$(dirname "$0")/bench.sh" ExtDS "$@"
