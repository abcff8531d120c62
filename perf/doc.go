// Package perf holds the benchmark drivers and scripts whose results go to
// docs/. Each compares against a baseline measured in the same run and
// reports ratios; the ones that need root skip with a reason without it.
//
//   - ext-eth.sh (BenchmarkExtEth, exteth_test.go): iperf3 and sockperf
//     over exn0 on shm against veth, and exnd's idle CPU (issue #3).
//   - extds.sh (BenchmarkExtDS, extds_test.go): EXT-DS between attached
//     processes against TCP over exn0 and veth (issue #5).
//   - ext-eth-net.sh (integration TestNetPerf): exn0 on the net fabric
//     against its underlay (issue #8).
//   - netperf.sh (BenchmarkNetperf, netperf_test.go): netperf TCP_RR,
//     TCP_CRR and TCP_STREAM through the shim, over exn0 and over veth
//     (issue #15); needs `make netperf`.
//   - fabric-compare.sh: the fabric backends side by side.
//   - bench.sh: the shared runner of ext-eth.sh, extds.sh and netperf.sh (build,
//     run once, clean up namespaces and shm files even when killed).
//
// The shim's numbers come from integration TestShimPerf, and
// `exnperf report` (perf/report) runs them all into docs/benchmarks.md.
//
// # Ownership and imports
//
// perf owns the benchmark drivers (its _test.go files) and scripts; the
// figures go to docs/. Its tests may import extds, integration/nstest and
// internal/testenv; no package imports it.
package perf
