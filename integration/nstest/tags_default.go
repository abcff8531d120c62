//go:build !ofi

package nstest

// buildTags are passed to go build for exnd (none in the default build).
const buildTags = ""
