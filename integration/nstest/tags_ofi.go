//go:build ofi

package nstest

// buildTags are passed to go build for exnd: this test binary has the
// libfabric backend, so exnd gets it too.
const buildTags = "ofi"
