//go:build ofi

package perf

// ofiBuilt says whether this test binary, and so the exnd nstest builds
// for it (integration/nstest/tags_ofi.go), has the libfabric backend.
const ofiBuilt = true
