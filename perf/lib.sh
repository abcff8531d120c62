# shellcheck shell=bash
# Sourced by the perf/ scripts that run a test binary needing root
# (perf/bench.sh, perf/ext-eth-net.sh): a temporary directory, $tmp,
# removed on exit, and perf_run, which runs the binary so that a signal to
# the script reaches it.

tmp=$(mktemp -d)
perf_pid=
perf_cleanup() {
	# The test binary tears down its own namespaces, processes and shm
	# files on exit and on SIGINT/SIGTERM; make sure it got the signal,
	# and sweep whatever a hard kill left behind.
	if [ -n "$perf_pid" ] && kill -0 "$perf_pid" 2>/dev/null; then
		kill -TERM "$perf_pid" 2>/dev/null || true
		wait "$perf_pid" 2>/dev/null || true
	fi
	for ns in $(ip netns list 2>/dev/null | awk '/^exnt-/{print $1}'); do
		owner=${ns#exnt-}; owner=${owner%%-*}
		if ! kill -0 "$owner" 2>/dev/null; then
			ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
			ip netns del "$ns" 2>/dev/null || true
		fi
	done
	for f in /dev/shm/exn-exnt_*; do
		[ -e "$f" ] || continue
		owner=${f#/dev/shm/exn-exnt_}; owner=${owner%%_*}
		kill -0 "$owner" 2>/dev/null || rm -f "$f"
	done
	rm -rf "$tmp"
}
trap perf_cleanup EXIT
trap 'exit 130' INT TERM

# perf_run OUT CMD...: runs the test binary command CMD in the background
# with EXN_PERF_OUT set to $tmp/table.md, waits for it, copies the markdown
# table it wrote into OUT (if OUT is not empty) and prints the table. Its
# status is CMD's.
perf_run() {
	local out=$1 rc=0
	shift
	EXN_PERF_OUT="$tmp/table.md" "$@" &
	perf_pid=$!
	wait "$perf_pid" || rc=$?
	perf_pid=
	if [ -n "$out" ] && [ -f "$tmp/table.md" ]; then
		cp "$tmp/table.md" "$out"
	fi
	echo
	cat "$tmp/table.md" 2>/dev/null || true
	return "$rc"
}
