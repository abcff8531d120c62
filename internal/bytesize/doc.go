// Package bytesize is the notation of byte counts in the benchmarks'
// names and the performance report: 64B, 4KiB, 1MiB (fabric/fabrictest
// names its RMA sub-benchmarks so; perf/report reads the sizes back and
// labels its tables and charts with "4 KiB"). It imports only the
// standard library.
package bytesize
