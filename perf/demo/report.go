package demo

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"text/tabwriter"
	"text/template"
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

type bar struct {
	X, Y, W, H float64
	Label      string
	Value      string
	Color      string
}

type tick struct {
	Y     float64
	Label string
}

type chart struct {
	Title  string
	Y0     float64 // top of the plot area
	Height float64
	Bars   []bar
	Ticks  []tick
	Legend []bar
}

type page struct {
	Width, Height float64
	Title         string
	Sub           string
	Charts        []chart
}

var svgTmpl = template.Must(template.New("svg").Parse(`<svg xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" font-family="sans-serif" font-size="11">
<rect width="100%" height="100%" fill="white"/>
<text x="20" y="24" font-size="16" font-weight="bold">{{.Title}}</text>
<text x="20" y="42" fill="#555">{{.Sub}}</text>
{{range .Charts}}<g>
<text x="20" y="{{.Y0}}" dy="-8" font-size="13" font-weight="bold">{{.Title}}</text>
{{range .Ticks}}<line x1="70" x2="{{$.Width}}" y1="{{.Y}}" y2="{{.Y}}" stroke="#ddd"/><text x="64" y="{{.Y}}" dy="4" text-anchor="end" fill="#555">{{.Label}}</text>
{{end}}{{range .Bars}}<rect x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" fill="{{.Color}}"><title>{{.Label}}: {{.Value}}</title></rect>
{{end}}{{range .Legend}}<rect x="{{.X}}" y="{{.Y}}" width="10" height="10" fill="{{.Color}}"/><text x="{{.X}}" y="{{.Y}}" dx="14" dy="9">{{.Label}}</text>
{{end}}</g>
{{end}}</svg>
`))

// WriteSVG writes a bar chart of throughput per pair and one of latency
// (p50 and p99) per pair.
func WriteSVG(path string, r *Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := renderSVG(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func renderSVG(w io.Writer, r *Result) error {
	const (
		left   = 80.0
		plotH  = 220.0
		chartH = plotH + 120
		top    = 80.0
	)
	n := len(r.Pairs)
	slot := 36.0
	if n > 24 {
		slot = 24
	}
	width := left + float64(n)*slot + 40
	if width < 640 {
		width = 640
	}
	pg := page{
		Width: width, Height: top + 2*chartH,
		Title: fmt.Sprintf("exnperf: %d-node in-process cluster", r.Nodes),
		Sub:   fmt.Sprintf("%s; fabric %s, MTU %d, %.1f s per pair", r.Transport, r.Fabric, r.MTU, r.DurationS),
	}
	labels := func(y0 float64) []bar {
		var ls []bar
		for i, p := range r.Pairs {
			ls = append(ls, bar{X: left + float64(i)*slot + slot/2, Y: y0 + plotH + 14, Label: short(p.From) + "→" + short(p.To)})
		}
		return ls
	}
	// Throughput.
	tp := chart{Title: "Throughput per pair (MB/s)", Y0: top, Height: plotH}
	maxTP := 0.0
	for _, p := range r.Pairs {
		maxTP = math.Max(maxTP, p.MBps)
		if p.DS != nil {
			maxTP = math.Max(maxTP, p.DS.MBps)
		}
	}
	scale, ticks := axis(maxTP, plotH, top)
	tp.Ticks = ticks
	ds := hasDS(r)
	bw := slot - 8
	if ds {
		bw /= 2
	}
	for i, p := range r.Pairs {
		x := left + float64(i)*slot + 4
		h := p.MBps * scale
		tp.Bars = append(tp.Bars, bar{X: x, Y: top + plotH - h, W: bw, H: h,
			Label: p.From + " → " + p.To + " TCP", Value: fmt.Sprintf("%.0f MB/s", p.MBps), Color: "#3b7dd8"})
		if p.DS != nil {
			h := p.DS.MBps * scale
			tp.Bars = append(tp.Bars, bar{X: x + bw, Y: top + plotH - h, W: bw, H: h,
				Label: p.From + " → " + p.To + " EXT-DS", Value: fmt.Sprintf("%.0f MB/s", p.DS.MBps), Color: "#8e44ad"})
		}
	}
	if ds {
		tp.Legend = []bar{{X: left, Y: top + plotH + 26, Label: "TCP over EXT-Eth", Color: "#3b7dd8"}, {X: left + 140, Y: top + plotH + 26, Label: "EXT-DS", Color: "#8e44ad"}}
	}
	// Latency, on a log scale: p99 tails are 10-1000× the p50s, and
	// EXT-DS p50s are 10× below TCP's.
	y1 := top + chartH
	lt := chart{Title: "1-byte round trip per pair (µs, log scale)", Y0: y1, Height: plotH}
	lo, hi := math.Inf(1), 0.0
	for _, p := range r.Pairs {
		lo, hi = math.Min(lo, p.Minus), math.Max(hi, p.P99us)
		if p.DS != nil {
			lo, hi = math.Min(lo, p.DS.Minus), math.Max(hi, p.DS.P99us)
		}
	}
	height, ticks := logAxis(lo, hi, plotH, y1)
	lt.Ticks = ticks
	type series struct {
		name  string
		color string
		v     func(p Pair) (float64, bool)
	}
	ss := []series{
		{"TCP p50", "#2a9d5c", func(p Pair) (float64, bool) { return p.P50us, true }},
		{"TCP p99", "#e07b39", func(p Pair) (float64, bool) { return p.P99us, true }},
	}
	if ds {
		ss = append(ss,
			series{"EXT-DS p50", "#8e44ad", func(p Pair) (float64, bool) {
				if p.DS == nil {
					return 0, false
				}
				return p.DS.P50us, true
			}},
			series{"EXT-DS p99", "#c39bd3", func(p Pair) (float64, bool) {
				if p.DS == nil {
					return 0, false
				}
				return p.DS.P99us, true
			}})
	}
	bw = (slot - 8) / float64(len(ss))
	for i, p := range r.Pairs {
		x := left + float64(i)*slot + 4
		for j, se := range ss {
			v, ok := se.v(p)
			if !ok {
				continue
			}
			h := height(v)
			lt.Bars = append(lt.Bars, bar{X: x + float64(j)*bw, Y: y1 + plotH - h, W: bw, H: h,
				Label: p.From + " → " + p.To + " " + se.name, Value: fmt.Sprintf("%.2f µs", v), Color: se.color})
		}
	}
	for j, se := range ss {
		lt.Legend = append(lt.Legend, bar{X: left + float64(j)*110, Y: y1 + plotH + 26, Label: se.name, Color: se.color})
	}
	// Pair labels under both charts, as legend-less text bars.
	for _, c := range []*chart{&tp, &lt} {
		for _, l := range labels(c.Y0) {
			c.Legend = append(c.Legend, bar{X: l.X - slot/2 + 2, Y: l.Y - 9, Label: l.Label, Color: "white"})
		}
	}
	pg.Charts = []chart{tp, lt}
	return svgTmpl.Execute(w, pg)
}

// logAxis maps values in [lo, hi] to bar heights on a log scale whose
// ends are whole decades, and returns the decade ticks.
func logAxis(lo, hi, plotH, y0 float64) (func(float64) float64, []tick) {
	if lo <= 0 || math.IsInf(lo, 1) {
		lo = 0.1
	}
	if hi < lo {
		hi = lo
	}
	d0, d1 := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if d1 == d0 {
		d1++
	}
	span := d1 - d0
	height := func(v float64) float64 {
		if v <= 0 {
			return 0
		}
		return math.Max((math.Log10(v)-d0)/span*plotH, 1) // at least a visible sliver
	}
	var ts []tick
	for d := d0; d <= d1; d++ {
		ts = append(ts, tick{Y: y0 + plotH - (d-d0)/span*plotH, Label: fmt.Sprintf("%g", math.Pow(10, d))})
	}
	return height, ts
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

// axis picks a round tick step for max and returns the value-to-pixel
// scale and the tick marks.
func axis(max, plotH, y0 float64) (float64, []tick) {
	if max <= 0 {
		max = 1
	}
	step := math.Pow(10, math.Floor(math.Log10(max)))
	for max/step > 5 {
		step *= 2
	}
	for max/step < 2 {
		step /= 2
	}
	top := math.Ceil(max/step) * step
	scale := plotH / top
	var ts []tick
	for v := 0.0; v <= top+step/2; v += step {
		ts = append(ts, tick{Y: y0 + plotH - v*scale, Label: fmt.Sprintf("%g", v)})
	}
	return scale, ts
}
