// Package svgchart draws the SVG charts of exn's benchmark reports: line
// charts of a quantity against a size in bytes and grouped bar charts, on
// a log or (bars) linear Y axis, and Stack, which puts several charts one
// above the other in one file. It is the one chart writer: perf/report
// draws docs/charts/*.svg with it and perf/demo the chart of
// "exnperf -svg".
//
// Output is deterministic (the same chart gives the same bytes) and every
// string is XML-escaped. A chart is a value; SVG renders it and does not
// modify it.
//
// # Ownership and imports
//
// svgchart owns the drawing (layout, axes, legend, palette, axis label
// formats), not what is plotted. It imports only the standard library
// and internal/bytesize (the size notation of the benchmarks' names);
// perf/report and perf/demo import it.
package svgchart
