//go:build !ofi

package perf

// ofiBuilt says whether this test binary, and so the exnd nstest builds
// for it, has the libfabric backend: not without the ofi tag.
const ofiBuilt = false
