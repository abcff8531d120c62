#!/bin/sh
# bench-ofi.sh: exn's ofi VELO ping-pong between two processes against
# libfabric's own fi_pingpong (libfabric-bin), on the shm and tcp
# providers, in the same run, interleaved round by round. Prints one line
# per provider:
#
#   ofi:<prov> exn p50 X us; fi_pingpong Y us; ratio R
#
# X: p50 one-way latency (half the round trip) of a 120 B VELO message
#    (a 128 B packet), BenchmarkPingPong2Proc in fabric/ofi, echo child
#    in a second process.
# Y: fi_pingpong -e rdm -S 128 (the same 128 B on the wire) usec/xfer,
#    libfabric's mean one-way time.
# R = X / Y. Each figure is the median over ROUNDS rounds.
#
# Environment: ROUNDS (3), ITERS (20000 round trips per measurement),
# PORT (fi_pingpong control port, 47731: off the default 47592 so other
# users of the machine do not collide), GO (go), RAW (file for the raw
# outputs; default a temp file that is removed).
set -eu
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-20000}
PORT=${PORT:-47731}
GO=${GO:-go}
cd "$(dirname "$0")/.."
command -v fi_pingpong >/dev/null || { echo "bench-ofi: fi_pingpong missing: apt-get install libfabric-bin" >&2; exit 1; }
tmp=$(mktemp -d /tmp/exn-bench-ofi.XXXXXX)
srv=
cleanup() {
	[ -n "$srv" ] && kill "$srv" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
RAW=${RAW:-$tmp/raw.txt}
: >"$RAW"
$GO test -tags ofi -c -o "$tmp/ofi.test" ./fabric/ofi/

# fipp PROV: one fi_pingpong server+client run; prints usec/xfer.
fipp() {
	fi_pingpong -p "$1" -e rdm -S 128 -I "$ITERS" -B "$PORT" >"$tmp/srv.txt" 2>&1 &
	srv=$!
	i=0
	until fi_pingpong -p "$1" -e rdm -S 128 -I "$ITERS" -P "$PORT" 127.0.0.1 >"$tmp/cli.txt" 2>&1; do
		i=$((i + 1))
		[ $i -lt 20 ] || { cat "$tmp/cli.txt" >&2; echo "bench-ofi: fi_pingpong $1 failed" >&2; exit 1; }
		sleep 0.1
	done
	wait "$srv" || true
	srv=
	cat "$tmp/cli.txt" >>"$RAW"
	awk '$1 == 128 { print $7 }' "$tmp/cli.txt"
}

# exnpp PROV: one BenchmarkPingPong2Proc run; prints p50 in µs.
exnpp() {
	"$tmp/ofi.test" -test.run '^$' -test.bench "^BenchmarkPingPong2Proc\$/^$1\$" \
		-test.benchtime "${ITERS}x" -test.count 1 >"$tmp/exn.txt" 2>&1 || { cat "$tmp/exn.txt" >&2; exit 1; }
	cat "$tmp/exn.txt" >>"$RAW"
	awk '{ for (i = 2; i <= NF; i++) if ($i == "p50-ns") printf "%.3f\n", $(i - 1) / 1000 }' "$tmp/exn.txt"
	# the mean one-way time, like fi_pingpong's figure, on stderr
	awk '{ for (i = 2; i <= NF; i++) if ($i == "ns/op") printf "%.3f\n", $(i - 1) / 2000 }' "$tmp/exn.txt" >>"$tmp/exnmean.$1"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "load before: $(cat /proc/loadavg)" >&2
for prov in shm tcp; do
	: >"$tmp/fi.$prov"
	: >"$tmp/exn.$prov"
	: >"$tmp/exnmean.$prov"
	r=0
	while [ $r -lt "$ROUNDS" ]; do
		fipp "$prov" >>"$tmp/fi.$prov"
		exnpp "$prov" >>"$tmp/exn.$prov"
		r=$((r + 1))
	done
	x=$(median <"$tmp/exn.$prov")
	y=$(median <"$tmp/fi.$prov")
	echo "ofi:$prov rounds: exn p50 [$(tr '\n' ' ' <"$tmp/exn.$prov")] exn mean [$(tr '\n' ' ' <"$tmp/exnmean.$prov")] fi_pingpong mean [$(tr '\n' ' ' <"$tmp/fi.$prov")] (us)" >&2
	awk -v p="$prov" -v x="$x" -v y="$y" 'BEGIN { printf "ofi:%s exn p50 %.2f us; fi_pingpong %.2f us; ratio %.2f\n", p, x, y, x / y }'
done
echo "load after: $(cat /proc/loadavg)" >&2
