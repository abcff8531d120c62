# shellcheck shell=bash
# Sourced by perf/crr-ab.sh and perf/cold-ping.sh: two exnd nodes of one
# binary on a fresh shm fabric in two namespaces, and their teardown. The
# caller sets tag (the namespaces' and the fabric's name prefix) and net
# (the nodes' /24, three octets) before it sources this file; it gets
# $tmp (removed on exit) and the functions below. Whatever it started
# with pids+=(PID) is stopped too.

tmp=$(mktemp -d)
pids=()
# stop_nodes stops the nodes and everything in pids, deletes the
# namespaces (killing what is left in them) and the fabric's shm files.
stop_nodes() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
	for i in 1 2; do
		ip netns pids "$tag$i" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$tag$i" 2>/dev/null || true
	done
	rm -f /dev/shm/exn-"$tag"-* "$tmp"/n?.sock
}
trap 'stop_nodes; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# start_nodes BIN starts exnd BIN as nodes 1 and 2 ($net.1 and $net.2,
# namespaces ${tag}1 and ${tag}2, control sockets $tmp/n1.sock and
# $tmp/n2.sock, logs $tmp/n1.log and $tmp/n2.log) and waits (at most
# 5 s) for both control sockets.
start_nodes() {
	for i in 1 2; do
		ip netns add "$tag$i"
		ip -n "$tag$i" link set lo up
		ip netns exec "$tag$i" "$1" --fabric "shm:$tag" --node-id $i --control "$tmp/n$i.sock" \
			--addr "$net.$i/24" --log-level warn >"$tmp/n$i.log" 2>&1 &
		pids+=($!)
	done
	for _ in $(seq 50); do [ -S "$tmp/n1.sock" ] && [ -S "$tmp/n2.sock" ] && break; sleep 0.1; done
}
