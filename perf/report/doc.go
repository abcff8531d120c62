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
// performance targets (bars.go), the Markdown writer and which charts are
// drawn from which results (charts.go); perf/svgchart draws them. It may
// import perf/svgchart, internal/bytesize (to read the sizes in the
// benchmarks' names) and the standard library, and runs the benchmarks
// as child processes, so it never links exn's other packages; cmd/exnperf
// imports it.
package report
