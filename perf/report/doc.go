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
package report
