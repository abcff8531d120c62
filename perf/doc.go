// Package perf holds the benchmark drivers and scripts whose results go to
// docs/.
package perf
