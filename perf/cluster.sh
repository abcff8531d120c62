#!/usr/bin/env bash
# Issue #36: liveness on the net fabric at cluster scale: 4 and 24 exnd
# nodes, one network namespace each on one underlay bridge, with the
# swim liveness (the default) and the heartbeat one: each exnd's idle
# CPU and sleeps per second, and how long until every peer reports a frozen (SIGSTOP) and a
# killed (SIGKILL) node down. Needs root and iproute2. Usage:
#
#   flock /tmp/exn-bench.lock perf/cluster.sh [results.md]
#       (EXN_CLUSTER_NODES=N sets the larger cluster, default 24)
#
# It runs BenchmarkCluster (perf/cluster_test.go); the simulation of
# 10 to 1,000 nodes is fabric/members' BenchmarkSimulation.
export TIMEOUT=${TIMEOUT:-30m}
exec "$(dirname "$0")/bench.sh" Cluster "$@"
