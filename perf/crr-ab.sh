#!/usr/bin/env bash
# netperf TCP_CRR through libextds.so with two exnd builds, interleaved
# (issue #15): an A/B of a change to connection setup, since single
# TCP_CRR runs on two shared vCPUs move by a third. Needs root, iproute2
# and the netperf build (make netperf). Usage:
#
#   perf/crr-ab.sh ROUNDS SECS EXND_A EXND_B [LIBEXTDS]
#
# Each round starts two exnd nodes of one binary on a fresh shm fabric in
# two namespaces (10.78.0.1/2), runs netserver and netperf under the shim
# (default bin/libextds.so) for SECS seconds, stops everything, then does
# the same with the other binary. It prints one line per run and the
# medians. Everything it starts is stopped, and its namespaces and shm
# files removed, on exit. AB_TEST=iperf3 measures plain TCP over exn0
# instead (iperf3, one stream, Gbit/s; no shim, no netperf needed): an
# A/B of a change to the fabric or the engine.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,17p' "$0"; exit 2; }
rounds=$1 secs=$2 mode=${AB_TEST:-TCP_CRR}
unit=trans/s
[ "$mode" = iperf3 ] && unit=Gbit/s
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
np=${EXN_NETPERF_DIR:-$root/build/netperf}
lib=${3:-$root/bin/libextds.so}
bins=("$1" "$2")
tag=crrab$$ net=10.78.0
. "$root/perf/twonodes.sh"

run() { # run BIN: prints transactions per second (AB_TEST=iperf3: Gbit/s)
	start_nodes "$1"
	if [ "$mode" = iperf3 ]; then
		ip netns exec "${tag}2" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
		pids+=($!)
		for _ in $(seq 50); do ip netns exec "${tag}1" ping -c1 -W1 10.78.0.2 >/dev/null 2>&1 && break; sleep 0.1; done
		ip netns exec "${tag}1" timeout $((secs + 20)) iperf3 -c 10.78.0.2 -p 5299 -t "$secs" -J 2>/dev/null |
			python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'
	else
		ip netns exec "${tag}2" env LD_PRELOAD="$lib" EXTDS_CONTROL="$tmp/n2.sock" "$np/netserver" -D -p 12865 >/dev/null 2>&1 &
		pids+=($!)
		sleep 0.5
		ip netns exec "${tag}1" env LD_PRELOAD="$lib" EXTDS_CONTROL="$tmp/n1.sock" timeout $((secs + 20)) \
			"$np/netperf" -H 10.78.0.2 -t TCP_CRR -l "$secs" 2>/dev/null | awk 'NF >= 6 && $1 ~ /^[0-9]+$/ { print $6; exit }'
	fi
	stop_nodes
}

echo "load at the start: $(cat /proc/loadavg)"
declare -A res
for r in $(seq "$rounds"); do
	for k in 0 1; do
		v=$(run "${bins[$k]}")
		echo "round $r ${bins[$k]} ${v:-failed} $unit"
		res[$k]="${res[$k]:-} ${v:-0}"
	done
done
for k in 0 1; do
	echo "median ${bins[$k]}: $(echo "${res[$k]}" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') $unit"
done
echo "load at the end: $(cat /proc/loadavg)"
