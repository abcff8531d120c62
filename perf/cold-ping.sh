#!/usr/bin/env bash
# Cold and warm fabric pings (`exnctl ping`) between two exnd builds or
# more, interleaved (issue #19): each run starts two nodes of one binary
# on a fresh shm fabric in two namespaces, then a client that stays up
# (python3, the control socket's line protocol) sends N single pings
# each after a second of quiet (cold), then 50 back to back (warm).
# Needs root, iproute2 and python3. Usage:
#
#   perf/cold-ping.sh ROUNDS N EXND...
#
# It prints one line per run: the cold RTTs (µs), their median, and the
# warm p50. Everything it starts is stopped, and its namespaces and shm
# files removed, on exit.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,12p' "$0"; exit 2; }
rounds=$1 n=$2
shift 2
tag=cping$$
tmp=$(mktemp -d)
pids=()
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
	for i in 1 2; do
		ip netns pids "$tag$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$tag$i" 2>/dev/null || true
	done
	rm -f /dev/shm/exn-"$tag"-*
}
trap 'stop; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

echo "load at the start: $(cat /proc/loadavg)"
for r in $(seq "$rounds"); do
	for bin in "$@"; do
		for i in 1 2; do
			ip netns add "$tag$i"
			ip -n "$tag$i" link set lo up
			ip netns exec "$tag$i" "$bin" --fabric "shm:$tag" --node-id $i --control "$tmp/n$i.sock" \
				--addr 10.77.99.$i/24 --log-level warn >"$tmp/n$i.log" 2>&1 &
			pids+=($!)
		done
		for _ in $(seq 50); do [ -S "$tmp/n1.sock" ] && [ -S "$tmp/n2.sock" ] && break; sleep 0.1; done
		sleep 1
		python3 - "$tmp/n1.sock" "$n" "$bin" <<'PY'
import json, socket, statistics, sys, time
path, n, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def ping(count):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rwb")
    f.write(b"ping 2 %d\n" % count)
    f.flush()
    r = json.loads(f.readline())
    s.close()
    return r["data"]["rtt_us"]
ping(1)
cold = []
for _ in range(n):
    time.sleep(1)
    cold += ping(1)
warm = ping(50)
print("%s cold %s median %.0f us; warm p50 %.1f us" % (name, " ".join("%.0f" % x for x in cold), statistics.median(cold), statistics.median(warm)))
PY
		stop
	done
done
echo "load at the end: $(cat /proc/loadavg)"
