#!/usr/bin/env bash
# ofi-exn0.sh: exn0 over ofi:tcp between two network namespaces, against
# the underlay it runs on, in one run (issue #16's third bar: iperf3 >=
# 0.5x the underlay, ping p50 <= 1 ms). Needs root, /dev/net/tun,
# libfabric-dev, iperf3, python3 (and perf for profiles). Usage:
#
#   perf/ofi-exn0.sh [profile-dir]     (ROUNDS=3 SECS=3 PINGS=30 PING_I=0.2 PROVIDER=tcp)
#
# Two namespaces joined by one veth pair (the underlay, 10.91.16.0/24),
# exnd --fabric ofi:$PROVIDER in each (peers file: the underlay address
# and port 7471 of each node; exn0 on 10.91.17.0/24). Per round, in this
# order: iperf3 1 stream for SECS seconds over the underlay, then over
# exn0; ping PINGS x 56 B at PING_I s intervals over exn0 and over the
# underlay. Prints the per-round values, the medians, the exn0/underlay
# ratio of the medians and each round's own ratio (exn0 against the veth
# run just before it, so a VM that slows down mid-run skews neither), the
# ping p50 and p90 (over all rounds' replies), and the CPU time both exnd
# used per GB moved over exn0 (user+system, /proc). With a profile-dir, `perf
# record -g` of both exnd during the last round's exn0 run goes there
# (perf report -i DIR/exnd-1.data); PERF_EVENTS adds perf record options,
# e.g. PERF_EVENTS='-e sched:sched_switch' for where exnd's threads sleep.
#
# NET=1 also starts exnd --fabric net in both namespaces over the same
# veth (exn1 on 10.91.18.0/24, port 7472) and adds an iperf3 run over it
# to every round, after the one over exn0, with its own ratio and CPU per
# GB: exn's own TCP fabric against libfabric's, in the same run. STAT=1
# counts, with `perf stat` during the last round's runs, the context
# switches and system calls of both exnd of each pair, per 64 KiB frame
# moved (DURING="cmd" runs cmd, with EXND_PIDS set to both exnd's pids,
# during the last round's exn0 run and prints its output, DURING_NET the
# same during the exn1 run; STAT_EVENTS adds perf events, e.g. syscalls:sys_enter_sendto,
# counted per node). exnd's environment is the caller's (GOMAXPROCS, FI_*). EXND=path
# runs that exnd binary instead of building one from the tree; EXND_ARGS
# adds flags to the ofi exnd (e.g. "--push=false --gomaxprocs 2").
#
# RAW=1 adds, to every round, libfabric's own bulk engine over the same
# veth: perf/testdata/ofi_rma_bw.c, 8 RMA GETs of 64 KiB in flight on
# ofi:$PROVIDER for SECS seconds between the two namespaces, no exn. Every
# run is then also priced in the whole machine's CPU time per GB
# (/proc/stat: every process and interrupt, not only exnd), and the
# script prints the ceiling that CPU price sets on exn0: with every CPU
# busy, exn0 must pay at least the kernel TCP that carries iperf3 (the
# veth run's whole-machine price) plus the bulk engine's (the raw run's),
# so it moves at most nproc / (that sum) GB per second, as a ratio of the
# veth. The ceiling leaves out the TAP's copies, EXT-Eth's control
# packets and any Go, so the real bound is lower.
# COPIES=1 (with RAW=1; needs perf) adds one more exn0 run after the
# rounds, profiled system-wide (`perf record -a -g` over SECS seconds),
# and prices the two copies of every byte that a TAP gateway makes and
# the veth path does not: the TAP read (_copy_to_iter under tun_do_read)
# and the TAP write (_copy_from_iter under tun_get_user), as perf/tap-
# bound.sh does on shm. The ceiling is then printed with them added, and
# once more at the CPUs' busy fraction that exn0 itself reached.
# PIN="A B" runs node 1's exnd (ofi and net) on CPU A and node 2's on
# CPU B (taskset -c), as an operator pins a gateway daemon
# (docs/operations.md, "CPU affinity"); iperf3 and the veth run are
# never pinned. IPERF_ARGS adds iperf3 client flags to every iperf3 run
# (underlay and exn0 alike), e.g. IPERF_ARGS="-P 2" or "-l 512K".
# Run it under the benchmark lock:
#
#   flock /tmp/exn-bench.lock perf/ofi-exn0.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-3}
PINGS=${PINGS:-30}
PING_I=${PING_I:-0.2}
PROVIDER=${PROVIDER:-tcp}
NET=${NET:-}
STAT=${STAT:-}
RAW=${RAW:-}
prof=${1:-}
tag=ofi2-$$ # unique per run: namespaces, veths
nsA=exn-$tag-a nsB=exn-$tag-b
vA=vo2a$$ vB=vo2b$$
tmp=$(mktemp -d /tmp/exn-ofi-exn0.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	ip netns del "$nsA" 2>/dev/null || true
	ip netns del "$nsB" 2>/dev/null || true
	[ -n "${KEEPLOGS:-}" ] && cat "$tmp"/exnd-*.log >&2
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -n "$prof" ] && mkdir -p "$prof"
if [ -n "${EXND:-}" ]; then
	cp "$EXND" "$tmp/exnd" # a prebuilt exnd (A/B runs of two builds)
else
	go build -tags ofi -o "$tmp/exnd" ./cmd/exnd
fi
[ -n "$RAW" ] && gcc -O2 -Wall -Werror -o "$tmp/ofi_rma_bw" perf/testdata/ofi_rma_bw.c -lfabric
ip netns add "$nsA"
ip netns add "$nsB"
ip link add "$vA" netns "$nsA" type veth peer name "$vB" netns "$nsB"
ip -n "$nsA" addr add 10.91.16.1/24 dev "$vA"
ip -n "$nsB" addr add 10.91.16.2/24 dev "$vB"
for ns in "$nsA" "$nsB"; do ip -n "$ns" link set lo up; done
ip -n "$nsA" link set "$vA" up
ip -n "$nsB" link set "$vB" up
printf '1 10.91.16.1:7471 10.91.17.1\n2 10.91.16.2:7471 10.91.17.2\n' >"$tmp/peers"
# pin ID: the taskset prefix that pins node ID's exnd (PIN="CPU1 CPU2"),
# or nothing.
pin() {
	[ -n "${PIN:-}" ] || return 0
	local cpus
	read -r -a cpus <<<"$PIN"
	echo taskset -c "${cpus[$(($1 - 1))]}"
}
start() { # start NS ID
	# shellcheck disable=SC2046 # pin prints a command prefix or nothing
	ip netns exec "$1" $(pin "$2") "$tmp/exnd" --node-id "$2" --fabric "ofi:$PROVIDER" --peers "$tmp/peers" \
		--addr "10.91.17.$2/24" --control "$tmp/exnd-$2.sock" --log-level warn ${EXND_ARGS:-} >"$tmp/exnd-$2.log" 2>&1 &
	pids+=($!)
	eval "exnd$2=$!"
}
start "$nsA" 1
start "$nsB" 2
if [ -n "$NET" ]; then
	printf '1 10.91.16.1:7472 10.91.18.1\n2 10.91.16.2:7472 10.91.18.2\n' >"$tmp/peers-net"
	for i in 1 2; do
		ns=$nsA
		[ "$i" = 2 ] && ns=$nsB
		# shellcheck disable=SC2046
		ip netns exec "$ns" $(pin "$i") "$tmp/exnd" --node-id "$i" --fabric "net:10.91.16.$i:7472" --peers "$tmp/peers-net" \
			--ifname exn1 --addr "10.91.18.$i/24" --control "$tmp/exnd-net-$i.sock" --log-level warn >"$tmp/exnd-net-$i.log" 2>&1 &
		pids+=($!)
		eval "net$i=$!"
	done
fi
ok=
for _ in $(seq 100); do
	if ip netns exec "$nsA" ping -c 1 -W 1 10.91.17.2 >/dev/null 2>&1; then ok=1; break; fi
	sleep 0.1
done
[ -n "$ok" ] || { cat "$tmp"/exnd-*.log >&2; echo "ofi-exn0: exn0 never came up" >&2; exit 1; }
if [ -n "$NET" ]; then
	ok=
	for _ in $(seq 100); do
		if ip netns exec "$nsA" ping -c 1 -W 1 10.91.18.2 >/dev/null 2>&1; then ok=1; break; fi
		sleep 0.1
	done
	[ -n "$ok" ] || { cat "$tmp"/exnd-net-*.log >&2; echo "ofi-exn0: exn1 (net) never came up" >&2; exit 1; }
fi
ip netns exec "$nsA" ping -c 2 -W 1 10.91.16.2 >/dev/null

ip netns exec "$nsB" iperf3 -s -p 5291 >/dev/null 2>&1 &
pids+=($!)
sleep 0.3

# gbit FILE: the Gbit/s an iperf3 -J report received.
gbit() {
	python3 -c 'import json,sys; print("%.2f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/1e9))' "$1"
}
# iperf DST: one 1-stream run; prints Gbit/s.
iperf() {
	# shellcheck disable=SC2086 # IPERF_ARGS is a list of iperf3 flags
	ip netns exec "$nsA" iperf3 -c "$1" -p 5291 -t "$SECS" ${IPERF_ARGS:-} -J --connect-timeout 2000 >"$tmp/ip.json"
	gbit "$tmp/ip.json"
}
# cpu PID: user+system clock ticks.
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
. perf/procstat.sh # busy: the machine's busy and total clock ticks
# mach NAME CMD...: runs CMD (which prints Gbit/s last) and appends
# "NAME busy-ticks total-ticks Gbit/s" to $tmp/mach.
mach() {
	local name=$1 b0 b1 g
	shift
	b0=$(busy)
	g=$("$@" | tail -1)
	b1=$(busy)
	echo "$name $b0 $b1 $g" >>"$tmp/mach"
	echo "$g"
}
# raw: one ofi_rma_bw run over the veth; prints its line, then Gbit/s.
raw() {
	ip netns exec "$nsB" "$tmp/ofi_rma_bw" -s 10.91.16.2 -p "$PROVIDER" -P 7481 &
	local t=$!
	timeout $((SECS + 30)) ip netns exec "$nsA" "$tmp/ofi_rma_bw" -c 10.91.16.2 -p "$PROVIDER" -P 7481 -w 8 -t "$SECS" >"$tmp/raw.out"
	wait "$t"
	cat "$tmp/raw.out" >>"$tmp/raw.all"
	sed -n 's/.* gbit=\([0-9.]*\) .*/\1/p' "$tmp/raw.out"
}

# stat LABEL PID1 PID2: perf stat of both exnd for SECS seconds, in the
# background; the counts land in $tmp/stat-LABEL-{1,2}.
stat() {
	local i=1 p
	for p in "$2" "$3"; do
		perf stat -x, -e "context-switches,raw_syscalls:sys_enter${STAT_EVENTS:+,$STAT_EVENTS}" -o "$tmp/stat-$1-$i" -p "$p" -- sleep "$SECS" >/dev/null 2>&1 &
		stats+=($!)
		i=$((i + 1))
	done
}
# counts LABEL GBIT: context switches and system calls of both exnd per
# 64 KiB frame (the stat window is SECS seconds of an iperf3 run of SECS).
counts() {
	python3 - "$tmp/stat-$1-1" "$tmp/stat-$1-2" "$2" "$SECS" "$1" <<'PY'
import sys
tot, each = {}, [{}, {}]
for i, f in enumerate(sys.argv[1:3]):
    for line in open(f):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0].replace(".", "").isdigit():
            tot[parts[2]] = tot.get(parts[2], 0) + float(parts[0])
            each[i][parts[2]] = float(parts[0])
frames = float(sys.argv[3]) * 1e9 / 8 * float(sys.argv[4]) / 65536
print("%s: per 64 KiB frame, both exnd: %.2f context switches, %.2f system calls"
      % (sys.argv[5], tot.get("context-switches", 0) / frames, tot.get("raw_syscalls:sys_enter", 0) / frames))
for ev in sorted(tot):
    if ev not in ("context-switches", "raw_syscalls:sys_enter"):
        print("  %s per frame: node 1 %.2f, node 2 %.2f" % (ev, each[0].get(ev, 0) / frames, each[1].get(ev, 0) / frames))
PY
}
# during CMD PID1 PID2 NAME CMD...: mach NAME CMD...; in the last round
# with CMD (DURING or DURING_NET) run meanwhile, EXND_PIDS="PID1 PID2",
# and its output on stderr after.
during() {
	local cmd=$1 p1=$2 p2=$3 dur=
	shift 3
	if [ -n "$cmd" ] && [ "$r" = "$ROUNDS" ]; then
		EXND_PIDS="$p1 $p2" bash -c "$cmd" >"$tmp/during" 2>&1 &
		dur=$!
	fi
	mach "$@"
	[ -z "$dur" ] || { wait "$dur"; cat "$tmp/during" >&2; }
}
# last_counts LABEL GBIT: in the last round under STAT, waits for the
# perf stat runs (stat LABEL ...) and appends their counts to $tmp/counts.
last_counts() {
	[ -n "$STAT" ] && [ "$r" = "$ROUNDS" ] || return 0
	wait "${stats[@]}"
	counts "$1" "$2" >>"$tmp/counts"
	stats=()
}

echo "load at the start: $(cat /proc/loadavg); $(nproc) CPUs; GOMAXPROCS=${GOMAXPROCS:-unset}; exnd pinned: ${PIN:-no}"
ul=() ex=() en=() rw=() : >"$tmp/rtt" : >"$tmp/rtt-ul" : >"$tmp/mach" : >"$tmp/raw.all" : >"$tmp/counts"
ticks=0 bytes=0 nticks=0 nbytes=0 stats=()
for r in $(seq "$ROUNDS"); do
	ul+=("$(mach underlay iperf 10.91.16.2)")
	c0=$(( $(cpu "$exnd1") + $(cpu "$exnd2") ))
	[ -n "$STAT" ] && [ "$r" = "$ROUNDS" ] && stat ofi "$exnd1" "$exnd2"
	if [ -n "$prof" ] && [ "$r" = "$ROUNDS" ]; then
		# shellcheck disable=SC2086 # PERF_EVENTS is a list of perf options
		perf record -g ${PERF_EVENTS:-} -o "$prof/exnd-1.data" -p "$exnd1" -- sleep "$SECS" >/dev/null 2>&1 &
		pr1=$!
		# shellcheck disable=SC2086
		perf record -g ${PERF_EVENTS:-} -o "$prof/exnd-2.data" -p "$exnd2" -- sleep "$SECS" >/dev/null 2>&1 &
		pr2=$!
	fi
	g=$(during "${DURING:-}" "$exnd1" "$exnd2" exn0 iperf 10.91.17.2)
	ex+=("$g")
	[ -n "$prof" ] && [ "$r" = "$ROUNDS" ] && wait "$pr1" "$pr2"
	ticks=$(( ticks + $(cpu "$exnd1") + $(cpu "$exnd2") - c0 ))
	bytes=$(python3 -c "print($bytes + $g * 1e9 / 8 * $SECS)")
	last_counts ofi "$g"
	if [ -n "$NET" ]; then
		c0=$(( $(cpu "$net1") + $(cpu "$net2") ))
		[ -n "$STAT" ] && [ "$r" = "$ROUNDS" ] && stat net "$net1" "$net2"
		g=$(during "${DURING_NET:-}" "$net1" "$net2" exn1 iperf 10.91.18.2)
		en+=("$g")
		nticks=$(( nticks + $(cpu "$net1") + $(cpu "$net2") - c0 ))
		nbytes=$(python3 -c "print($nbytes + $g * 1e9 / 8 * $SECS)")
		last_counts net "$g"
	fi
	[ -n "$RAW" ] && rw+=("$(mach raw raw)")
	ip netns exec "$nsA" ping -c "$PINGS" -i "$PING_I" -s 56 10.91.17.2 |
		sed -n 's/.*time=\([0-9.]*\) ms/\1/p' >>"$tmp/rtt"
	ip netns exec "$nsA" ping -c "$PINGS" -i "$PING_I" -s 56 10.91.16.2 |
		sed -n 's/.*time=\([0-9.]*\) ms/\1/p' >>"$tmp/rtt-ul"
done
copies=
if [ -n "${COPIES:-}" ]; then
	# shellcheck disable=SC2086
	ip netns exec "$nsA" iperf3 -c 10.91.17.2 -p 5291 -t $((SECS + 2)) ${IPERF_ARGS:-} -J >"$tmp/copies.json" &
	ipf=$!
	sleep 1
	perf record -a -g -o "$tmp/copies.data" -- sleep "$SECS" >/dev/null 2>&1
	wait "$ipf"
	# pct PARENT SYM: the per cent of all samples in SYM called under PARENT.
	pct() {
		perf report -i "$tmp/copies.data" --no-children --sort parent,sym -p "$1" -x -g none --stdio 2>/dev/null |
			awk -v p="$1" -v s="$2" '$2 == p && $4 == s { sub("%", "", $1); t += $1 } END { printf "%.3f", t + 0 }'
	}
	copies="$(pct tun_do_read _copy_to_iter) $(pct tun_get_user _copy_from_iter) $(gbit "$tmp/copies.json")"
fi
hz=$(getconf CLK_TCK)
python3 - "$tmp/rtt" "$tmp/rtt-ul" "$hz" "$ticks" "$bytes" "${ul[*]}" "${ex[*]}" "$nticks" "$nbytes" "${en[*]}" <<'PY'
import sys, statistics as st
rtt = sorted(float(x) for x in open(sys.argv[1]) if x.strip())
rul = sorted(float(x) for x in open(sys.argv[2]) if x.strip())
hz, ticks, nbytes = float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
ul = [float(x) for x in sys.argv[6].split()]
ex = [float(x) for x in sys.argv[7].split()]
mu, me = st.median(ul), st.median(ex)
p = lambda q, v=rtt: v[min(len(v) - 1, int(q * len(v)))]
print("underlay (veth) iperf3 Gbit/s: %s median %.2f" % (ul, mu))
print("exn0 on ofi iperf3 Gbit/s:     %s median %.2f" % (ex, me))
print("exn0/underlay %.2fx (bar 0.5x)" % (me / mu))
pr = [e / u for u, e in zip(ul, ex)]  # each round's exn0 against the veth run just before it
print("exn0/underlay per round: %s median %.2fx" % (["%.2f" % x for x in pr], st.median(pr)))
print("exn0 ping RTT ms over %d replies: p50 %.3f p90 %.3f min %.3f max %.3f (bar p50 1 ms)" % (len(rtt), p(0.5), p(0.9), rtt[0], rtt[-1]))
print("underlay ping RTT ms over %d replies: p50 %.3f p90 %.3f" % (len(rul), p(0.5, rul), p(0.9, rul)))
print("exnd CPU (both) per GB over exn0: %.2f s" % (ticks / hz / (nbytes / 1e9)))
if sys.argv[10].strip():
    en = [float(x) for x in sys.argv[10].split()]
    print("exn1 on net iperf3 Gbit/s:     %s median %.2f, /underlay %.2fx, exnd CPU (both) per GB %.2f s"
          % (en, st.median(en), st.median(en) / mu, float(sys.argv[8]) / hz / (float(sys.argv[9]) / 1e9)))
PY
[ -n "$STAT" ] && cat "$tmp/counts"
if [ -n "$RAW" ]; then
	echo "libfabric's own GET loop (ofi_rma_bw -w 8, 64 KiB) over the veth:"
	sed 's/^/  /' "$tmp/raw.all"
fi
python3 - "$tmp/mach" "$(nproc)" "$hz" "$SECS" "$copies" <<'PY'
import sys, statistics as st
runs = {}
for line in open(sys.argv[1]):
    name, b0, t0, b1, t1, g = line.split()
    busy, tot, g = float(b1) - float(b0), float(t1) - float(t0), float(g)
    ncpu, hz, secs = int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    gb = g / 8 * secs
    runs.setdefault(name, []).append((g, busy / tot, busy / hz / gb if gb else 0))
print("whole machine, medians over rounds: Gbit/s, CPUs busy, CPU-s per GB (every process)")
med = {}
for name, v in runs.items():
    med[name] = [st.median(x[i] for x in v) for i in range(3)]
    print("  %-8s %6.2f Gbit/s  %3.0f %% busy  %.3f CPU-s/GB" % (name, med[name][0], 100 * med[name][1], med[name][2]))
if "raw" in med and "underlay" in med:
    ncpu = int(sys.argv[2])
    cu, cr = med["underlay"][2], med["raw"][2]
    ceil = ncpu / (cu + cr) * 8
    print("exn0 ceiling from CPU: %d CPUs / (%.3f + %.3f CPU-s/GB) = %.1f Gbit/s = %.2fx the veth (bar 0.5x); exn0 reached %.2fx"
          % (ncpu, cu, cr, ceil, ceil / med["underlay"][0], med["exn0"][0] / med["underlay"][0]))
    if sys.argv[5].strip():
        cto, cfrom, pg = (float(x) for x in sys.argv[5].split())
        secs = float(sys.argv[4])
        gb = pg / 8 * secs  # GB moved while perf sampled
        tr, tw = cto / 100 * secs * ncpu / gb, cfrom / 100 * secs * ncpu / gb
        ceil = ncpu / (cu + cr + tr + tw) * 8
        busy = med["exn0"][1]
        print("TAP copies (profiled exn0 run, %.2f Gbit/s): read %.3f + write %.3f CPU-s/GB (%.2f %% + %.2f %% of all samples)"
              % (pg, tr, tw, cto, cfrom))
        print("exn0 ceiling with the TAP copies: %d CPUs / (%.3f + %.3f + %.3f CPU-s/GB) = %.1f Gbit/s = %.2fx the veth; at exn0's %.0f %% busy %.2fx; exn0 reached %.2fx"
              % (ncpu, cu, cr, tr + tw, ceil, ceil / med["underlay"][0], 100 * busy, busy * ceil / med["underlay"][0], med["exn0"][0] / med["underlay"][0]))
    if "exn1" in med:
        ceil = ncpu / (2 * cu) * 8
        print("exn1 (net) ceiling from CPU: %d CPUs / (2 x %.3f CPU-s/GB) = %.1f Gbit/s = %.2fx the veth; exn1 reached %.2fx"
              % (ncpu, cu, ceil, ceil / med["underlay"][0], med["exn1"][0] / med["underlay"][0]))
PY
echo "load at the end: $(cat /proc/loadavg)"
