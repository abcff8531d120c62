package demo

import (
	"fmt"
	"io"
	"math"
	"os"
	"text/tabwriter"
	"time"

	"github.com/exn-project/exn/perf/svgchart"
)

// WriteTable prints r: a header with the machine's CPUs and load and the
// sampling, a table of the measured pairs, the distribution across them
// and a summary line. EXT-DS columns appear when the run measured EXT-DS.
func WriteTable(w io.Writer, r *Result) error {
	fmt.Fprintf(w, "exnperf: %d nodes, fabric %s, %s, MTU %d\nTCP: %s\n", r.Nodes, r.Fabric, r.Transport, r.MTU, r.TCP)
	fmt.Fprintf(w, "machine: %s\n", machineLine(r.Machine))
	fmt.Fprintf(w, "pairs: %s\n\n", samplingLine(r))
	ds := hasDS(r)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "from\tto\tTCP MB/s\tGbit/s\tMiB sent\trtt p50 µs\trtt p99 µs\trtt min µs\t"
	if ds {
		head += "EXT-DS MB/s\tGbit/s\trtt p50 µs\trtt p99 µs\t"
	}
	fmt.Fprintln(tw, head)
	for _, p := range r.Pairs {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t",
			p.From, p.To, p.MBps, p.Gbps, float64(p.Bytes)/(1<<20), p.P50us, p.P99us, p.Minus)
		if ds && p.DS != nil {
			fmt.Fprintf(tw, "%.0f\t%.2f\t%.2f\t%.2f\t", p.DS.MBps, p.DS.Gbps, p.DS.P50us, p.DS.P99us)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("demo: table: %w", err)
	}
	if len(r.Pairs) == 0 {
		return nil
	}
	s := Summarize(r.Pairs)
	fmt.Fprintf(w, "\ndistribution across %d pairs (of %d):\n", len(r.Pairs), r.Sampling.Total)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tp10\tmedian\tp90\tmin\tmax\t")
	row := func(name, f string, d Dist) {
		fmt.Fprintf(tw, "%s\t"+f+"\t"+f+"\t"+f+"\t"+f+"\t"+f+"\t\n", name, d.P10, d.Median, d.P90, d.Min, d.Max)
	}
	row("TCP throughput MB/s", "%.0f", s.TCPMBps)
	row("TCP rtt p50 µs", "%.1f", s.TCPP50us)
	if s.DSMBps != nil {
		row("EXT-DS throughput MB/s", "%.0f", *s.DSMBps)
		row("EXT-DS rtt p50 µs", "%.2f", *s.DSP50us)
		row("EXT-DS/TCP rtt p50 ratio", "%.3f", *s.RTTRatio)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("demo: table: %w", err)
	}
	_, err := fmt.Fprintf(w, "\n%d pairs: TCP throughput median %.0f MB/s (min %.0f, max %.0f); rtt p50 median %.1f µs; "+
		"%d rendezvous frames, %d engine drops; %.2f s start-up, %.1f s wall\n",
		len(r.Pairs), s.TCPMBps.Median, s.TCPMBps.Min, s.TCPMBps.Max, s.TCPP50us.Median, r.EngineRx, r.EngineDrop, r.StartupS, r.WallS)
	if err != nil {
		return fmt.Errorf("demo: table: %w", err)
	}
	if s.DSMBps != nil {
		_, err := fmt.Fprintf(w, "EXT-DS: throughput median %.0f MB/s (%.2f× TCP), rtt p50 median %.2f µs (per-pair ratio to TCP: median %.3f×)\n",
			s.DSMBps.Median, s.DSMBps.Median/s.TCPMBps.Median, s.DSP50us.Median, s.RTTRatio.Median)
		if err != nil {
			return fmt.Errorf("demo: table: %w", err)
		}
	}
	return nil
}

// busyLoad is the 1-minute load per CPU at the start above which the
// header warns that the figures share the machine.
const busyLoad = 0.5

// machineLine is the header's account of the machine.
func machineLine(m Machine) string {
	s := fmt.Sprintf("%d CPUs, GOMAXPROCS %d; load average (1/5/15 min) ", m.NumCPU, m.GOMAXPROCS)
	la := func(l *LoadAvg) string {
		if l == nil {
			return "unknown"
		}
		return l.String()
	}
	s += la(m.LoadStart) + " at start, " + la(m.LoadEnd) + " at end"
	if m.LoadErr != "" {
		s += " (" + m.LoadErr + ")"
	}
	// The end's load includes the demo's own; the start's is other work.
	if m.LoadStart != nil && m.NumCPU > 0 && m.LoadStart.One >= busyLoad*float64(m.NumCPU) {
		s += "; other work was running at the start: expect noisy figures"
	}
	return s
}

// samplingLine says how many pairs were measured, by which rule, and
// how long each test was.
func samplingLine(r *Result) string {
	sp := r.Sampling
	var s string
	if sp.Rule == "all" {
		s = fmt.Sprintf("%d of %d ordered pairs measured (all pairs)", sp.Measured, sp.Total)
	} else {
		s = fmt.Sprintf("%d of %d ordered pairs measured (ring i -> i+1 and %d random peers per node, seed %d; %d senders, %d receivers)",
			sp.Measured, sp.Total, sp.Peers, sp.Seed, sp.Senders, sp.Receivers)
	}
	s += fmt.Sprintf("; per pair and path: %s throughput test, %d round trips", fmtSeconds(r.DurationS), r.RoundTrips)
	if sp.Scale < 1 {
		s += fmt.Sprintf(" (scaled from %s and %d to fit the %s budget)", fmtSeconds(sp.RequestedS), sp.RequestedRoundTrips, fmtSeconds(sp.BudgetS))
	}
	return s
}

func fmtSeconds(s float64) string {
	return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
}

func hasDS(r *Result) bool {
	for _, p := range r.Pairs {
		if p.DS != nil {
			return true
		}
	}
	return false
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

// chartPairsMax is the most pairs the chart draws one by one (1262 px
// wide at demoSlotDense); a run with more draws their distribution.
const chartPairsMax = 48

// WriteSVG writes a bar chart of throughput and one of latency (p50 and
// p99), one above the other, in one SVG file: per pair up to
// chartPairsMax pairs, else the distribution across pairs (min, p10,
// median, p90, max).
func WriteSVG(path string, r *Result) error {
	if err := os.WriteFile(path, renderSVG(r), 0o644); err != nil {
		return fmt.Errorf("demo: chart: %w", err)
	}
	return nil
}

// renderSVG draws the two charts with perf/svgchart, the writer the
// benchmark report uses too.
func renderSVG(r *Result) []byte {
	ds := hasDS(r)
	tp := svgchart.BarChart{
		Title:  fmt.Sprintf("exnperf: %d-node in-process cluster: throughput per pair", r.Nodes),
		Note:   fmt.Sprintf("%s; fabric %s, MTU %d, %s per pair", r.Transport, r.Fabric, r.MTU, fmtSeconds(r.DurationS)),
		YLabel: "throughput (MB/s)", YFormat: svgchart.TrimNum,
		Bars: []string{"TCP over EXT-Eth"}, Colors: []string{colorTCP},
		Linear: true, HideValues: true,
	}
	// Latency, on a log scale: p99 tails are 10-1000× the p50s, and
	// EXT-DS p50s are 10× below TCP's.
	lt := svgchart.BarChart{
		Title:  "1-byte round trip per pair (log scale)",
		YLabel: "round trip", YFormat: svgchart.FmtNs,
		Bars: []string{"TCP p50", "TCP p99"}, Colors: []string{colorTCPp50, colorTCPp99},
		HideValues: true,
	}
	if ds {
		tp.Bars, tp.Colors = append(tp.Bars, "EXT-DS"), append(tp.Colors, colorDS)
		lt.Bars, lt.Colors = append(lt.Bars, "EXT-DS p50", "EXT-DS p99"), append(lt.Colors, colorDS, colorDSp99)
	}
	if len(r.Pairs) > chartPairsMax {
		distCharts(r, ds, &tp, &lt)
		return svgchart.Stack(tp, lt)
	}
	slot := demoSlot
	if len(r.Pairs) > denseAfter {
		slot = demoSlotDense
	}
	tp.Width = 110 + len(r.Pairs)*slot // 110: the Y axis and the right margin
	lt.Width = tp.Width
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

// distGroups are the groups of a distribution chart.
var distGroups = []string{"min", "p10", "median", "p90", "max"}

// distCharts fills tp and lt with the distribution across r's pairs:
// a group per statistic in distGroups, a bar per series.
func distCharts(r *Result, ds bool, tp, lt *svgchart.BarChart) {
	what := fmt.Sprintf("across %d sampled pairs (of %d)", len(r.Pairs), r.Sampling.Total)
	tp.Title = fmt.Sprintf("exnperf: %d-node in-process cluster: throughput %s", r.Nodes, what)
	tp.Note += "; per-pair figures in the JSON"
	lt.Title = "1-byte round trip " + what + " (log scale)"
	lt.Note = "each series is a per-pair figure (its rtt p50 or p99); the groups are its distribution across the pairs"
	col := func(f func(Pair) float64) Dist {
		xs := make([]float64, 0, len(r.Pairs))
		for _, p := range r.Pairs {
			xs = append(xs, f(p))
		}
		return Distribution(xs)
	}
	dsOf := func(f func(*PathResult) float64) func(Pair) float64 {
		return func(p Pair) float64 {
			if p.DS == nil {
				return math.NaN()
			}
			return f(p.DS)
		}
	}
	const us = 1e3 // FmtNs takes nanoseconds
	tps := []Dist{col(func(p Pair) float64 { return p.MBps })}
	lts := []Dist{col(func(p Pair) float64 { return p.P50us * us }), col(func(p Pair) float64 { return p.P99us * us })}
	if ds {
		tps = append(tps, col(dsOf(func(d *PathResult) float64 { return d.MBps })))
		lts = append(lts, col(dsOf(func(d *PathResult) float64 { return d.P50us * us })),
			col(dsOf(func(d *PathResult) float64 { return d.P99us * us })))
	}
	for i, g := range distGroups {
		tp.Groups = append(tp.Groups, svgchart.BarGroup{Label: g, Values: distValues(tps, i)})
		lt.Groups = append(lt.Groups, svgchart.BarGroup{Label: g, Values: distValues(lts, i)})
	}
}

// distValues returns statistic i (in distGroups order) of each Dist.
func distValues(ds []Dist, i int) []float64 {
	v := make([]float64, len(ds))
	for j, d := range ds {
		v[j] = [...]float64{d.Min, d.P10, d.Median, d.P90, d.Max}[i]
		if d.N == 0 {
			v[j] = math.NaN()
		}
	}
	return v
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
