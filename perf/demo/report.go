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

// WriteTable prints r as an aligned table with a summary line.
func WriteTable(w io.Writer, r *Result) error {
	fmt.Fprintf(w, "exnperf: %d nodes, fabric %s, %s, MTU %d\nTCP: %s\n\n", r.Nodes, r.Fabric, r.Transport, r.MTU, r.TCP)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "from\tto\tMB/s\tGbit/s\tMiB sent\trtt p50 µs\trtt p99 µs\trtt min µs\t")
	var tp, p50 []float64
	for _, p := range r.Pairs {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t\n",
			p.From, p.To, p.MBps, p.Gbps, float64(p.Bytes)/(1<<20), p.P50us, p.P99us, p.Minus)
		tp = append(tp, p.MBps)
		p50 = append(p50, p.P50us)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(tp) > 0 {
		slices.Sort(tp)
		slices.Sort(p50)
		_, err := fmt.Fprintf(w, "\n%d pairs: throughput median %.0f MB/s (min %.0f, max %.0f); rtt p50 median %.1f µs; "+
			"%d rendezvous frames, %d engine drops; %.1f s wall\n",
			len(tp), tp[len(tp)/2], tp[0], tp[len(tp)-1], p50[len(p50)/2], r.EngineRx, r.EngineDrop, r.WallS)
		return err
	}
	return nil
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
		chartH = plotH + 110
		top    = 80.0
	)
	n := len(r.Pairs)
	slot := 36.0
	if n > 24 {
		slot = 24
	}
	width := left + float64(n)*slot + 40
	if width < 520 {
		width = 520
	}
	pg := page{
		Width: width, Height: top + 2*chartH,
		Title: fmt.Sprintf("exnperf: %d-node in-process cluster, TCP over EXT-Eth on netstack", r.Nodes),
		Sub:   fmt.Sprintf("fabric %s, MTU %d, %.1f s per pair", r.Fabric, r.MTU, r.DurationS),
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
	}
	scale, ticks := axis(maxTP, plotH, top)
	tp.Ticks = ticks
	for i, p := range r.Pairs {
		h := p.MBps * scale
		tp.Bars = append(tp.Bars, bar{X: left + float64(i)*slot + 4, Y: top + plotH - h, W: slot - 8, H: h,
			Label: p.From + " → " + p.To, Value: fmt.Sprintf("%.0f MB/s", p.MBps), Color: "#3b7dd8"})
	}
	// Latency.
	y1 := top + chartH
	lt := chart{Title: "TCP 1-byte round trip per pair (µs)", Y0: y1, Height: plotH}
	maxL := 0.0
	for _, p := range r.Pairs {
		maxL = math.Max(maxL, p.P99us)
	}
	scale, ticks = axis(maxL, plotH, y1)
	lt.Ticks = ticks
	for i, p := range r.Pairs {
		x := left + float64(i)*slot + 4
		w := (slot - 8) / 2
		h50, h99 := p.P50us*scale, p.P99us*scale
		lt.Bars = append(lt.Bars,
			bar{X: x, Y: y1 + plotH - h50, W: w, H: h50, Label: p.From + " → " + p.To + " p50", Value: fmt.Sprintf("%.1f µs", p.P50us), Color: "#2a9d5c"},
			bar{X: x + w, Y: y1 + plotH - h99, W: w, H: h99, Label: p.From + " → " + p.To + " p99", Value: fmt.Sprintf("%.1f µs", p.P99us), Color: "#e07b39"})
	}
	lt.Legend = []bar{{X: width - 160, Y: y1 - 22, Label: "p50", Color: "#2a9d5c"}, {X: width - 100, Y: y1 - 22, Label: "p99", Color: "#e07b39"}}
	// Pair labels under both charts, as legend-less text bars.
	for _, c := range []*chart{&tp, &lt} {
		for _, l := range labels(c.Y0) {
			c.Legend = append(c.Legend, bar{X: l.X - slot/2 + 2, Y: l.Y - 9, Label: l.Label, Color: "white"})
		}
	}
	pg.Charts = []chart{tp, lt}
	return svgTmpl.Execute(w, pg)
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
