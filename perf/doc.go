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
//   - wakeup.sh (BenchmarkWakeup, wakeup_test.go, gofloor_test.go): ping
//     and sockperf over exn0 against veth, cold and warm `exnctl ping`
//     against a C floor (testdata/fifo_pingpong.c) and a Go floor, idle
//     CPU (issue #19); cold-ping.sh:
//     cold and warm fabric pings of several exnd builds, interleaved.
//   - offload.sh (BenchmarkOffload, offload_test.go): exn0 with and
//     without TAP offloads against the kernel's path (issue #20);
//     tap-bound.sh: what the TAP's own copies cost at -P 4, and the bound
//     they put on exn0 against veth; tap-relay.sh (BenchmarkTAPRelay,
//     taprelay_test.go): exn0 on shm, net and ofi:tcp against the
//     smallest TAP gateways of the same shapes (testdata/tap_fwd.c) and
//     the kernel's path (issue #35).
//   - bench-ofi.sh (make bench-ofi): the ofi VELO ping-pong against
//     fi_pingpong; ofi-exn0.sh: exn0 over ofi:tcp (and, with NET=1, over
//     the net fabric) against their underlay, and with RAW=1 against
//     libfabric's own GET loop (testdata/ofi_rma_bw.c, held by
//     TestOFIRawBW under the ofi tag) and the ceiling the machine's CPU
//     puts on exn0 (issue #16).
//   - shim-direct.sh (BenchmarkShimDirect, shimdirect_test.go) and
//     crr-ab.sh: the shim's direct connections, and an A/B of two exnd
//     builds under netperf TCP_CRR (issues #14, #15).
//   - shim-xhost.sh (BenchmarkShimXHost, shimxhost_test.go): the shim's
//     direct connections across hosts on net and ofi:tcp against the
//     underlay, exn0, the relay and fi_pingpong, and the exnds' idle CPU
//     with 100 direct connections open (testdata/hold_conns.c; issue #38).
//   - shim-upgrade.sh (BenchmarkShimUpgrade, upgrade_test.go): the
//     shim's mid-stream upgrade (EXTDS_SETUP=upgrade) against TCP over
//     exn0: TCP_CRR, TCP_RR after it, a long connection opened during a
//     burst, and when a connection becomes direct (issue #33).
//   - bench.sh: the shared runner of ext-eth.sh, extds.sh, netperf.sh,
//     wakeup.sh, offload.sh, shim-direct.sh, shim-xhost.sh,
//     shim-upgrade.sh, ping-bound.sh and tap-relay.sh (build, run once,
//     clean up namespaces and shm files even when killed); lib.sh and
//     twonodes.sh are sourced by the scripts that start test binaries or
//     exnd nodes themselves, and procstat.sh by the ones that price a run
//     in the whole machine's CPU.
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
