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
tag=cping$$ net=10.77.99
. "$(dirname "$0")/twonodes.sh"

echo "load at the start: $(cat /proc/loadavg)"
for r in $(seq "$rounds"); do
	for bin in "$@"; do
		start_nodes "$bin"
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
		stop_nodes
	done
done
echo "load at the end: $(cat /proc/loadavg)"
