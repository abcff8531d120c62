//go:build ofi && cgo

package ofi

// Built reports whether this binary has the libfabric backend.
const Built = true
