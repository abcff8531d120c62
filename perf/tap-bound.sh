#!/usr/bin/env bash
# What the TAP alone costs at full load (issue #20, the `-P 4` bar).
#
# Between the same two namespaces it runs iperf3 with STREAMS streams
# over a veth pair (the kernel's path) and over exn0 on shm (exnd in each
# namespace), interleaved, ROUNDS times, and reads the whole machine's
# CPU time from /proc/stat over each run: Gbit/s, how busy the CPUs
# were, and CPU-seconds per GB moved. Then one more exn0 run under a
# system-wide `perf record` prices the two copies that any TAP gateway
# makes of every byte, and that the veth path does not: the TAP read
# (tun_do_read's _copy_to_iter) and the TAP write (tun_get_user's
# _copy_from_iter), both in exnd's context. On shm exnd makes no other
# kernel copies, so exnd's samples of those two functions are the TAP's.
#
# exn0's path does all the kernel work of the veth path (both TCP ends,
# the copies in and out of iperf3) and the two TAP copies besides. So
# even an exnd that cost nothing else, with every CPU busy all the time,
# could move at most NCPU / (veth CPU-s/GB + TAP copies CPU-s/GB) GB/s;
# the script prints that as a ratio to the veth's measured rate (the
# bound), beside the measured ratio. As a baseline for the copies it
# also times memcpy of 64 KiB frames between two rings of 64 slots (a
# C loop, the size of exnd's slot pools) and prints the same bound with
# copies at that speed. The bound means something only when
# the veth run keeps the CPUs busy too (at -P 4 on 2 CPUs it does, ~90 %;
# at one stream it does not). Needs
# root, iproute2, iperf3, python3 and perf (linux-perf). Usage:
#
#   flock /tmp/exn-bench.lock perf/tap-bound.sh [ROUNDS] [SECS] [STREAMS] [EXND]
#
# (defaults 2, 4, 4 and a fresh build of ./cmd/exnd). Everything it starts
# is stopped, and its namespaces and shm files removed, on exit.
set -euo pipefail
rounds=${1:-2} secs=${2:-4} streams=${3:-4}
root=$(cd "$(dirname "$0")/.." && pwd)
command -v perf >/dev/null || { echo "tap-bound: needs perf (apt-get install linux-perf)" >&2; exit 2; }
tag=tapb$$ net=10.75.0
. "$root/perf/twonodes.sh"
bin=${4:-}
if [ -z "$bin" ]; then
	bin=$tmp/exnd
	(cd "$root" && go build -o "$bin" ./cmd/exnd)
fi

# The memcpy baseline: CPU-seconds per GB for 64 KiB copies between two
# 4 MiB rings, the source rewritten as a sending kernel would.
cat >"$tmp/memcpy.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
int main(void) {
	const size_t fr = 65536, slots = 64, total = 16ull << 30;
	char *src = aligned_alloc(4096, fr * slots), *dst = aligned_alloc(4096, fr * slots);
	if (!src || !dst) return 1;
	memset(src, 1, fr * slots);
	memset(dst, 2, fr * slots);
	struct timespec a, b;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
	for (size_t done = 0, i = 0; done < total; done += fr, i++) {
		memcpy(dst + (i % slots) * fr, src + (i * 7 % slots) * fr, fr);
		src[i * 7 % slots * fr] ^= 1;
	}
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
	double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
	printf("%.5f %d\n", s / ((double)total / 1e9), dst[12345]);
	return 0;
}
C
gcc -O2 -o "$tmp/memcpy" "$tmp/memcpy.c"

start_nodes "$bin"
ip link add "v${tag}a" netns "${tag}1" type veth peer name "v${tag}b" netns "${tag}2"
ip -n "${tag}1" addr add 10.75.1.1/24 dev "v${tag}a"
ip -n "${tag}2" addr add 10.75.1.2/24 dev "v${tag}b"
ip -n "${tag}1" link set "v${tag}a" up
ip -n "${tag}2" link set "v${tag}b" up
ip netns exec "${tag}2" iperf3 -s -p 5298 >/dev/null 2>&1 &
pids+=($!)
ok=
for _ in $(seq 50); do
	if ip netns exec "${tag}1" ping -c1 -W1 "$net.2" >/dev/null 2>&1; then ok=1; break; fi
	sleep 0.1
done
[ -n "$ok" ] || { cat "$tmp"/n?.log >&2; echo "tap-bound: exn0 never came up" >&2; exit 1; }
ip netns exec "${tag}1" ping -c1 -W1 10.75.1.2 >/dev/null

. "$root/perf/procstat.sh"
# run DST SECS: one iperf3 run; prints "Gbit/s busy-fraction"
run() {
	local b0 t0 b1 t1 g
	read -r b0 t0 < <(busy)
	g=$(ip netns exec "${tag}1" iperf3 -c "$1" -p 5298 -t "$2" -P "$streams" -J |
		python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))')
	read -r b1 t1 < <(busy)
	echo "$g $(python3 -c "print(($b1-$b0)/($t1-$t0))")"
}

echo "load at the start: $(cat /proc/loadavg); $(nproc) CPUs"
: >"$tmp/veth" : >"$tmp/exn0"
for _ in $(seq "$rounds"); do
	run 10.75.1.2 "$secs" >>"$tmp/veth"
	run "$net.2" "$secs" >>"$tmp/exn0"
done

# The profiled exn0 run: iperf3 for SECS+2 s, perf over the middle SECS.
ip netns exec "${tag}1" iperf3 -c "$net.2" -p 5298 -t $((secs + 2)) -P "$streams" -J >"$tmp/prof.json" &
ipf=$!
sleep 1
perf record -a -g -o "$tmp/perf.data" -- sleep "$secs" >/dev/null 2>&1
wait "$ipf"
perf report -i "$tmp/perf.data" --no-children --sort comm,sym -g none --stdio 2>/dev/null >"$tmp/report"
mc=$("$tmp/memcpy" | cut -d' ' -f1)
echo "load at the end: $(cat /proc/loadavg)"

python3 - "$tmp/veth" "$tmp/exn0" "$tmp/report" "$tmp/prof.json" "$secs" "$(nproc)" "$streams" "$mc" <<'PY'
import json, re, statistics as st, sys
veth, exn0, report, prof, secs, ncpu, streams, mc = sys.argv[1:9]
mc = float(mc)
secs, ncpu = float(secs), int(ncpu)
def runs(path):
    return [tuple(map(float, l.split())) for l in open(path) if l.strip()]
def cpu_per_gb(g, busy):
    return busy * ncpu / (g / 8)  # CPU-s per s / GB per s
v, e = runs(veth), runs(exn0)
vg, eg = st.median(g for g, _ in v), st.median(g for g, _ in e)
vc = st.median(cpu_per_gb(g, b) for g, b in v)
ec = st.median(cpu_per_gb(g, b) for g, b in e)
pct = {"_copy_to_iter": 0.0, "_copy_from_iter": 0.0}
for line in open(report):
    m = re.match(r"\s*([\d.]+)%\s+exnd\S*\s+\[k\]\s+(\S+)", line)
    if m and m.group(2) in pct:
        pct[m.group(2)] += float(m.group(1))
pg = json.load(open(prof))["end"]["sum_received"]["bits_per_second"] / 1e9
gb = pg / 8 * secs  # GB moved while perf sampled
copy = {k: p / 100 * secs * ncpu / gb for k, p in pct.items()}
tap = sum(copy.values())
print("iperf3 -P %s, %d rounds of %g s, medians (Gbit/s; busy; whole-machine CPU-s/GB):" % (streams, len(v), secs))
print("  veth: %s -> %.2f Gbit/s, %.3f CPU-s/GB" % (" ".join("%.2f(%.0f%%)" % (g, b * 100) for g, b in v), vg, vc))
print("  exn0: %s -> %.2f Gbit/s, %.3f CPU-s/GB" % (" ".join("%.2f(%.0f%%)" % (g, b * 100) for g, b in e), eg, ec))
print("  exn0/veth %.2fx" % (eg / vg))
print("profiled exn0 run %.2f Gbit/s: TAP read copy %.3f, TAP write copy %.3f CPU-s/GB (%.1f%% and %.1f%% of all samples)"
      % (pg, copy["_copy_to_iter"], copy["_copy_from_iter"], pct["_copy_to_iter"], pct["_copy_from_iter"]))
best = ncpu / (vc + tap) * 8  # Gbit/s with all CPUs busy and exnd free besides the copies
print("bound from the TAP copies alone: %d CPUs / (%.3f + %.3f) CPU-s/GB = %.2f Gbit/s = %.2fx veth"
      % (ncpu, vc, tap, best, best / vg))
fast = ncpu / (vc + 2 * mc) * 8
print("memcpy of 64 KiB frames: %.4f CPU-s/GB; the TAP copies cost %.1fx that; at memcpy speed the bound would be %.2fx veth"
      % (mc, tap / 2 / mc, fast / vg))
PY
