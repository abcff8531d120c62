// Package integration holds the root-only tests that run exnd in network
// namespaces with unmodified iperf3, sockperf and ping.
//
// # Ownership and imports
//
// integration owns end-to-end tests only (no non-test code besides this
// file). Its tests may import any exn package and integration/nstest; no
// package imports it.
package integration
