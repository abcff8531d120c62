// Package dring owns the shared buffer of an EXT-DS direct connection
// (docs/direct.md): its layout (version 3), making and opening its files
// (the buffer, and the two sides' bells: the ends of one AF_UNIX stream
// socket pair, one bell per side), mapping and checking it,
// and a Go endpoint for one side that speaks the same protocol as the C
// shim (shim/dring.c). exnd uses the endpoint to relay a side after exec
// and to close a side whose last descriptor is gone; tests use it as the
// Go half of the cross-language conformance test.
//
// Nothing in a mapped buffer is trusted: every cursor is checked on every
// load, and a buffer that breaks the invariants fails the connection
// (ErrCorrupt) instead of reading or writing out of bounds.
package dring
