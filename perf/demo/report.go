package demo

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"text/tabwriter"

	"github.com/exn-project/exn/perf/svgchart"
)

// WriteTable prints r as an aligned table with a summary line. EXT-DS
// columns appear when the run measured EXT-DS.
func WriteTable(w io.Writer, r *Result) error {
	fmt.Fprintf(w, "exnperf: %d nodes, fabric %s, %s, MTU %d\nTCP: %s\n\n", r.Nodes, r.Fabric, r.Transport, r.MTU, r.TCP)
	ds := hasDS(r)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "from\tto\tTCP MB/s\tGbit/s\tMiB sent\trtt p50 µs\trtt p99 µs\trtt min µs\t"
	if ds {
		head += "EXT-DS MB/s\tGbit/s\trtt p50 µs\trtt p99 µs\t"
	}
	fmt.Fprintln(tw, head)
	var tp, p50, dtp, d50 []float64
	for _, p := range r.Pairs {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t",
			p.From, p.To, p.MBps, p.Gbps, float64(p.Bytes)/(1<<20), p.P50us, p.P99us, p.Minus)
		if ds && p.DS != nil {
			fmt.Fprintf(tw, "%.0f\t%.2f\t%.2f\t%.2f\t", p.DS.MBps, p.DS.Gbps, p.DS.P50us, p.DS.P99us)
			dtp = append(dtp, p.DS.MBps)
			d50 = append(d50, p.DS.P50us)
		}
		fmt.Fprintln(tw)
		tp = append(tp, p.MBps)
		p50 = append(p50, p.P50us)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(tp) > 0 {
		_, err := fmt.Fprintf(w, "\n%d pairs: TCP throughput median %.0f MB/s (min %.0f, max %.0f); rtt p50 median %.1f µs; "+
			"%d rendezvous frames, %d engine drops; %.1f s wall\n",
			len(tp), median(tp), slices.Min(tp), slices.Max(tp), median(p50), r.EngineRx, r.EngineDrop, r.WallS)
		if err != nil {
			return err
		}
	}
	if len(dtp) > 0 {
		_, err := fmt.Fprintf(w, "EXT-DS: throughput median %.0f MB/s (%.2f× TCP), rtt p50 median %.2f µs (%.2f× TCP)\n",
			median(dtp), median(dtp)/median(tp), median(d50), median(d50)/median(p50))
		return err
	}
	return nil
}

func hasDS(r *Result) bool {
	for _, p := range r.Pairs {
		if p.DS != nil {
			return true
		}
	}
	return false
}

// median of xs (sorted in place).
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// The colours of the demo's series: TCP over EXT-Eth in blue and green
// (throughput, p50), orange for its p99, EXT-DS in purples.
const (
	colorTCP      = "#3b7dd8"
	colorTCPp50   = "#2a9d5c"
	colorTCPp99   = "#e07b39"
	colorDS       = "#8e44ad"
	colorDSp99    = "#c39bd3"
	demoSlot      = 36 // px per pair, wide enough for four bars and a label
	demoSlotDense = 24 // px per pair beyond denseAfter pairs
	denseAfter    = 24
)

// WriteSVG writes a bar chart of throughput per pair and one of latency
// (p50 and p99) per pair, one above the other, in one SVG file.
func WriteSVG(path string, r *Result) error {
	return os.WriteFile(path, renderSVG(r), 0o644)
}

// renderSVG draws the two charts with perf/svgchart, the writer the
// benchmark report uses too.
func renderSVG(r *Result) []byte {
	ds := hasDS(r)
	slot := demoSlot
	if len(r.Pairs) > denseAfter {
		slot = demoSlotDense
	}
	width := 110 + len(r.Pairs)*slot // 110: the Y axis and the right margin
	tp := svgchart.BarChart{
		Title:  fmt.Sprintf("exnperf: %d-node in-process cluster: throughput per pair", r.Nodes),
		Note:   fmt.Sprintf("%s; fabric %s, MTU %d, %.1f s per pair", r.Transport, r.Fabric, r.MTU, r.DurationS),
		YLabel: "throughput (MB/s)", YFormat: svgchart.TrimNum,
		Bars: []string{"TCP over EXT-Eth"}, Colors: []string{colorTCP},
		Linear: true, HideValues: true, Width: width,
	}
	// Latency, on a log scale: p99 tails are 10-1000× the p50s, and
	// EXT-DS p50s are 10× below TCP's.
	lt := svgchart.BarChart{
		Title:  "1-byte round trip per pair (log scale)",
		YLabel: "round trip", YFormat: svgchart.FmtNs,
		Bars: []string{"TCP p50", "TCP p99"}, Colors: []string{colorTCPp50, colorTCPp99},
		HideValues: true, Width: width,
	}
	if ds {
		tp.Bars, tp.Colors = append(tp.Bars, "EXT-DS"), append(tp.Colors, colorDS)
		lt.Bars, lt.Colors = append(lt.Bars, "EXT-DS p50", "EXT-DS p99"), append(lt.Colors, colorDS, colorDSp99)
	}
	const us = 1e3 // FmtNs takes nanoseconds
	for _, p := range r.Pairs {
		label := short(p.From) + "→" + short(p.To)
		tv := []float64{p.MBps}
		lv := []float64{p.P50us * us, p.P99us * us}
		if ds {
			if p.DS != nil {
				tv = append(tv, p.DS.MBps)
				lv = append(lv, p.DS.P50us*us, p.DS.P99us*us)
			} else {
				tv = append(tv, math.NaN())
				lv = append(lv, math.NaN(), math.NaN())
			}
		}
		tp.Groups = append(tp.Groups, svgchart.BarGroup{Label: label, Values: tv})
		lt.Groups = append(lt.Groups, svgchart.BarGroup{Label: label, Values: lv})
	}
	return svgchart.Stack(tp, lt)
}

// short returns the last octet of a dotted address, for axis labels.
func short(ip string) string {
	for i := len(ip) - 1; i >= 0; i-- {
		if ip[i] == '.' {
			return ip[i+1:]
		}
	}
	return ip
}
