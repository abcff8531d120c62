# shellcheck shell=bash
# Sourced by perf/tap-bound.sh and perf/ofi-exn0.sh: the whole machine's
# CPU time from /proc/stat, for CPU-seconds per GB of every process and
# interrupt (not only exnd's).

# busy prints the machine's busy clock ticks (user, nice, system, irq,
# softirq, steal) and its total ticks since boot; the difference of two
# readings over a run gives how busy the CPUs were.
busy() { awk '/^cpu / { print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9 }' /proc/stat; }
