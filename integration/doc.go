// Package integration holds the root-only tests that run exnd in network
// namespaces with unmodified iperf3, sockperf and ping.
package integration
