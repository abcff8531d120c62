// Package report runs exn's benchmark matrix as child processes (go test
// -bench -json, and the root-only namespace benchmarks), saves one JSON
// file of results per section, and writes docs/benchmarks.md and SVG
// charts from them. It backs "exnperf report".
//
// A section's results are a SectionFile:
//
//	{"section": "fabric-shm", "title": ..., "command": "go test ...",
//	 "results": [{"suite","name","metric","value","unit","baseline",
//	              "ratio","command", ...}]}
//
// so the document can be regenerated from saved results (-from DIR)
// without re-running anything.
//
// # Ownership and imports
//
// report owns the benchmark matrix, the results' JSON form, the
// performance targets (bars.go) and the Markdown and SVG writers. It imports
// only the standard library and runs the benchmarks as child processes, so
// it never links exn's own packages; cmd/exnperf imports it.
package report
