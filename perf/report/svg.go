package report

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Pt is one point of a line series.
type Pt struct{ X, Y float64 }

// Series is one line of a LineChart.
type Series struct {
	Name  string
	Color string
	Dash  bool
	Pts   []Pt
}

// LineChart plots Y against sizes in bytes (log2 X axis) on a log10 Y
// axis.
type LineChart struct {
	Title, XLabel, YLabel string
	YFormat               func(float64) string
	Series                []Series
	Note                  string // small text under the title
}

// BarGroup is one path of a BarChart: a value per bar series (NaN for
// none).
type BarGroup struct {
	Label  string // "\n" splits lines
	Values []float64
}

// BarChart draws grouped bars on a log10 Y axis.
type BarChart struct {
	Title, YLabel string
	YFormat       func(float64) string
	Bars          []string // bar series names (legend)
	Colors        []string
	Groups        []BarGroup
	Note          string
}

const (
	svgW, svgH   = 820, 460
	plotL, plotT = 86, 62
	plotR, plotB = svgW - 190, svgH - 70 // plotR: with the legend at the right
)

// Palette: colour-blind-safe (Okabe–Ito).
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"}

type svgBuf struct {
	bytes.Buffer
	right     int  // plot area's right edge
	legendTop bool // legend in one row above the plot, not at the right
}

func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

func (w *svgBuf) text(x, y float64, anchor, extra, s string) {
	fmt.Fprintf(w, `<text x="%.1f" y="%.1f" text-anchor="%s"%s>%s</text>`+"\n", x, y, anchor, extra, esc(s))
}

func (w *svgBuf) header(title, note string) {
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", svgW, svgH)
	w.text(svgW/2, 24, "middle", ` font-size="16" font-weight="bold"`, title)
	if note != "" {
		w.text(svgW/2, 42, "middle", ` font-size="11" fill="#555555"`, note)
	}
}

// logRange returns decade bounds around the positive values.
func logRange(vs []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		if v > 0 && !math.IsInf(v, 0) && !math.IsNaN(v) {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		return 1, 10
	}
	lo = math.Pow(10, math.Floor(math.Log10(lo)))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	return lo, hi
}

// yAxis draws log10 gridlines and labels and returns the Y mapping.
func (w *svgBuf) yAxis(lo, hi float64, label string, f func(float64) string) func(float64) float64 {
	ly, hy := math.Log10(lo), math.Log10(hi)
	y := func(v float64) float64 { return plotB - (math.Log10(v)-ly)/(hy-ly)*(plotB-plotT) }
	decades := int(math.Round(hy - ly))
	for d := 0; d <= decades; d++ {
		base := lo * math.Pow(10, float64(d))
		for _, m := range []float64{1, 2, 5} {
			v := base * m
			if v > hi*1.0001 {
				break
			}
			yy := y(v)
			if m == 1 {
				fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#cccccc"/>`+"\n", plotL, yy, w.right, yy)
				w.text(plotL-6, yy+4, "end", "", f(v))
			} else {
				fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eeeeee"/>`+"\n", plotL, yy, w.right, yy)
				if decades <= 2 {
					w.text(plotL-6, yy+4, "end", ` fill="#777777" font-size="10"`, f(v))
				}
			}
		}
	}
	fmt.Fprintf(w, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle" font-size="13">%s</text>`+"\n", float64(plotT+plotB)/2, esc(label))
	return y
}

func (w *svgBuf) frame() {
	fmt.Fprintf(w, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#333333"/>`+"\n", plotL, plotT, w.right-plotL, plotB-plotT)
}

func (w *svgBuf) legend(items []Series) {
	x, y := float64(w.right+16), float64(plotT+8)
	if w.legendTop {
		x, y = float64(w.right), float64(plotT-10)
		for _, s := range items {
			x -= 44 + 7*float64(len(s.Name))
		}
	}
	for _, s := range items {
		dash := ""
		if s.Dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(w, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"%s/>`+"\n", x, y, x+26, y, s.Color, dash)
		w.text(x+32, y+4, "start", "", s.Name)
		if w.legendTop {
			x += 44 + 7*float64(len(s.Name))
			continue
		}
		y += 20
	}
}

// SVG renders the line chart.
func (c LineChart) SVG() []byte {
	if c.YFormat == nil {
		c.YFormat = trimNum
	}
	w := svgBuf{right: plotR}
	w.header(c.Title, c.Note)
	var xs, ys []float64
	for _, s := range c.Series {
		for _, p := range s.Pts {
			xs = append(xs, p.X)
			ys = append(ys, p.Y)
		}
	}
	slices.Sort(xs)
	xs = slices.Compact(xs)
	if len(xs) == 0 {
		xs = []float64{1, 2}
	}
	lx, hx := math.Log2(xs[0])-0.5, math.Log2(xs[len(xs)-1])+0.5
	x := func(v float64) float64 { return plotL + (math.Log2(v)-lx)/(hx-lx)*float64(w.right-plotL) }
	lo, hi := logRange(ys)
	y := w.yAxis(lo, hi, c.YLabel, c.YFormat)
	for _, v := range xs {
		xx := x(v)
		fmt.Fprintf(&w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eeeeee"/>`+"\n", xx, plotT, xx, plotB)
		fmt.Fprintf(&w, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333333"/>`+"\n", xx, plotB, xx, plotB+5)
		w.text(xx, plotB+19, "middle", "", SizeName(int(v)))
	}
	w.text(float64(plotL+w.right)/2, plotB+44, "middle", ` font-size="13"`, c.XLabel)
	w.frame()
	for _, s := range c.Series {
		pts := slices.Clone(s.Pts)
		slices.SortFunc(pts, func(a, b Pt) int { return int(math.Copysign(1, a.X-b.X)) })
		var path []string
		for _, p := range pts {
			if p.Y > 0 {
				path = append(path, fmt.Sprintf("%.1f,%.1f", x(p.X), y(p.Y)))
			}
		}
		if len(path) == 0 {
			continue
		}
		dash := ""
		if s.Dash {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&w, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2.5"%s/>`+"\n", strings.Join(path, " "), s.Color, dash)
		for _, p := range path {
			xy := strings.Split(p, ",")
			fmt.Fprintf(&w, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", xy[0], xy[1], s.Color)
		}
	}
	w.legend(c.Series)
	w.WriteString("</svg>\n")
	return w.Bytes()
}

// SVG renders the bar chart.
func (c BarChart) SVG() []byte {
	if len(c.Colors) == 0 {
		c.Colors = palette
	}
	if c.YFormat == nil {
		c.YFormat = trimNum
	}
	// Bars use the full width, the legend goes above the plot.
	w := svgBuf{right: svgW - 24, legendTop: true}
	w.header(c.Title, c.Note)
	var vs []float64
	for _, g := range c.Groups {
		vs = append(vs, g.Values...)
	}
	lo, hi := logRange(vs)
	y := w.yAxis(lo, hi, c.YLabel, c.YFormat)
	n := max(len(c.Groups), 1)
	gw := float64(w.right-plotL) / float64(n)
	bw := gw * 0.8 / float64(max(len(c.Bars), 1))
	for gi, g := range c.Groups {
		gx := float64(plotL) + gw*float64(gi)
		for bi, v := range g.Values {
			if !(v > 0) || math.IsInf(v, 0) || bi >= len(c.Bars) {
				continue
			}
			bx := gx + gw*0.1 + bw*float64(bi)
			by := y(v)
			fmt.Fprintf(&w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`+"\n",
				bx, by, bw-1, float64(plotB)-by, c.Colors[bi%len(c.Colors)], esc(strings.ReplaceAll(g.Label, "\n", " ")+" "+c.Bars[bi]+": "+c.YFormat(v)))
			w.text(bx+bw/2, by-4, "middle", ` font-size="9"`, c.YFormat(v))
		}
		for li, l := range strings.Split(g.Label, "\n") {
			w.text(gx+gw/2, float64(plotB)+17+float64(li)*14, "middle", ` font-size="11"`, l)
		}
	}
	w.frame()
	var leg []Series
	for i, b := range c.Bars {
		leg = append(leg, Series{Name: b, Color: c.Colors[i%len(c.Colors)]})
	}
	w.legend(leg)
	w.WriteString("</svg>\n")
	return w.Bytes()
}

// fmtBytesRate labels an MB/s axis.
func fmtBytesRate(v float64) string {
	switch {
	case v >= 1000:
		return trimNum(v/1000) + " GB/s"
	case v >= 1:
		return trimNum(v) + " MB/s"
	}
	return trimNum(v*1000) + " kB/s"
}

// fmtNs labels a nanosecond axis.
func fmtNs(v float64) string {
	switch {
	case v >= 1e6:
		return trimNum(v/1e6) + " ms"
	case v >= 1e3:
		return trimNum(v/1e3) + " µs"
	}
	return trimNum(v) + " ns"
}

func trimNum(v float64) string {
	if v >= 10 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

// ChartFile is a chart written by WriteCharts.
type ChartFile struct {
	Name     string   // file name in charts/
	Title    string   // alt text
	Sections []string // sections it illustrates
	Headline bool     // shown at the top (and in the README)
}

// LatencyPath is one bar group of the latency chart: where its p50 and
// p99 come from.
type latencyPath struct {
	label       string
	suite, name string
	baseline    bool   // take the result's baseline, not its value
	baseName    string // with baseline: the BaselineName to match
}

var latencyPaths = []latencyPath{
	{label: "VELO 120 B\nmem", suite: "fabric-mem", name: "VELO ping-pong 120 B, one way"},
	{label: "VELO 120 B\nshm", suite: "fabric-shm", name: "VELO ping-pong 120 B, one way"},
	{label: "VELO 120 B\nnet (TCP lo)", suite: "fabric-net", name: "VELO ping-pong 120 B, one way"},
	{label: "EXT-DS lib\n64 B (mem)", suite: "extds", name: "ping-pong 64 B, one way"},
	{label: "TCP loopback\n64 B (Go)", suite: "extds", name: "ping-pong 64 B, one way", baseline: true, baseName: "TCP loopback"},
	{label: "EXT-DS shim\nsockperf", suite: "shim", name: "sockperf ping-pong, one way", baseName: "TCP over exn0"},
	{label: "TCP over exn0\nsockperf", suite: "exteth-tap", name: "sockperf TCP ping-pong, one way"},
	{label: "veth\nsockperf", suite: "exteth-tap", name: "sockperf TCP ping-pong, one way", baseline: true, baseName: "veth"},
}

func (p latencyPath) value(all []Result, metric string) float64 {
	for _, r := range all {
		if r.Suite != p.suite || r.Name != p.name || r.Metric != metric {
			continue
		}
		if p.baseName != "" && r.BaselineName != p.baseName {
			continue
		}
		if p.baseline {
			return r.Baseline
		}
		return r.Value
	}
	return math.NaN()
}

// fallback: TCP over exn0 and veth from the shim section when the TAP
// section did not run.
func latencyValue(all []Result, p latencyPath, metric string) float64 {
	v := p.value(all, metric)
	if !math.IsNaN(v) || p.suite != "exteth-tap" {
		return v
	}
	q := latencyPath{suite: "shim", name: "sockperf ping-pong, one way", baseline: true, baseName: "TCP over exn0"}
	if p.baseline {
		q.baseName = "veth"
	}
	return q.value(all, metric)
}

// Charts builds every chart the results allow, keyed by file name.
func Charts(files []*SectionFile) ([]ChartFile, map[string][]byte) {
	var all []Result
	for _, f := range files {
		all = append(all, f.Results...)
	}
	var list []ChartFile
	out := map[string][]byte{}

	// Latency percentiles per path.
	lc := BarChart{Title: "One-way latency by path (half a ping-pong round trip)", YLabel: "latency (log scale)", YFormat: fmtNs,
		Bars: []string{"p50", "p99"}, Colors: []string{palette[0], palette[1]},
		Note: "lower is better; VELO = raw fabric message, EXT-DS = stream sockets, sockperf = TCP ping-pong between two netns"}
	var secs []string
	for _, p := range latencyPaths {
		p50, p99 := latencyValue(all, p, "p50"), latencyValue(all, p, "p99")
		if math.IsNaN(p50) && math.IsNaN(p99) {
			continue
		}
		lc.Groups = append(lc.Groups, BarGroup{Label: p.label, Values: []float64{p50, p99}})
		secs = append(secs, p.suite)
	}
	if len(lc.Groups) > 0 {
		list = append(list, ChartFile{Name: "latency.svg", Title: lc.Title, Sections: secs, Headline: true})
		out["latency.svg"] = lc.SVG()
	}

	// RMA bandwidth by size, per backend, with memcpy.
	rc := LineChart{Title: "RMA bandwidth by transfer size", XLabel: "transfer size (log scale)", YLabel: "bandwidth (log scale)", YFormat: fmtBytesRate,
		Note: "higher is better; one request in flight; solid = GET, dashed = PUT; memcpy = copy() of the same size in the same run"}
	memcpy := map[float64][]float64{}
	for i, be := range []string{"mem", "shm", "net"} {
		for _, op := range []string{"get", "put"} {
			s := Series{Name: be + " " + strings.ToUpper(op), Color: palette[i], Dash: op == "put"}
			for _, r := range all {
				if r.Suite == "fabric-"+be && r.Series == op && r.Size > 0 {
					s.Pts = append(s.Pts, Pt{float64(r.Size), r.Value})
					if r.Baseline > 0 {
						memcpy[float64(r.Size)] = append(memcpy[float64(r.Size)], r.Baseline)
					}
				}
			}
			if len(s.Pts) > 0 {
				rc.Series = append(rc.Series, s)
			}
		}
	}
	if len(rc.Series) > 0 {
		s := Series{Name: "memcpy (median)", Color: palette[6]}
		for x, vs := range memcpy {
			s.Pts = append(s.Pts, Pt{x, Median(vs)})
		}
		rc.Series = append(rc.Series, s)
		list = append(list, ChartFile{Name: "rma-bandwidth.svg", Title: rc.Title, Sections: []string{"fabric-mem", "fabric-shm", "fabric-net"}})
		out["rma-bandwidth.svg"] = rc.SVG()
	}

	// EXT-DS stream throughput by write size vs TCP loopback.
	sc := LineChart{Title: "EXT-DS stream throughput by write size", XLabel: "write size (log scale)", YLabel: "throughput (log scale)", YFormat: fmtBytesRate,
		Note: "higher is better; one connection, one direction; EXT-DS over fabric/mem vs kernel TCP over loopback, same run"}
	ex, tcp := Series{Name: "EXT-DS (mem)", Color: palette[0]}, Series{Name: "TCP loopback", Color: palette[1], Dash: true}
	for _, r := range all {
		if r.Suite == "extds" && r.Series == "stream" {
			ex.Pts = append(ex.Pts, Pt{float64(r.Size), r.Value})
			if r.Baseline > 0 {
				tcp.Pts = append(tcp.Pts, Pt{float64(r.Size), r.Baseline})
			}
		}
	}
	if len(ex.Pts) > 0 {
		sc.Series = []Series{ex, tcp}
		list = append(list, ChartFile{Name: "extds-stream.svg", Title: sc.Title, Sections: []string{"extds"}})
		out["extds-stream.svg"] = sc.SVG()
	}

	// EXT-Eth engine by frame size vs memcpy.
	ec := LineChart{Title: "EXT-Eth engine throughput by frame size (fabric/mem)", XLabel: "Ethernet frame size (log scale)", YLabel: "throughput (log scale)", YFormat: fmtBytesRate,
		Note: "higher is better; batches of 32 frames to the receiver's Link; memcpy = one copy() of the frame, same run"}
	en, mc := Series{Name: "engine", Color: palette[2]}, Series{Name: "memcpy", Color: palette[6], Dash: true}
	for _, r := range all {
		if r.Suite == "exteth-engine" && r.Size > 0 {
			en.Pts = append(en.Pts, Pt{float64(r.Size), r.Value})
			if r.Baseline > 0 {
				mc.Pts = append(mc.Pts, Pt{float64(r.Size), r.Baseline})
			}
		}
	}
	if len(en.Pts) > 0 {
		ec.Series = []Series{en, mc}
		list = append(list, ChartFile{Name: "exteth-engine.svg", Title: ec.Title, Sections: []string{"exteth-engine"}})
		out["exteth-engine.svg"] = ec.SVG()
	}
	if nc, ok := netperfChart(all); ok { // netperf.go
		list = append(list, ChartFile{Name: "netperf.svg", Title: nc.Title, Sections: []string{"netperf"}})
		out["netperf.svg"] = nc.SVG()
	}
	return list, out
}

// WriteCharts writes the charts into dir.
func WriteCharts(dir string, files []*SectionFile) ([]ChartFile, error) {
	list, data := Charts(files)
	for _, c := range list {
		if err := os.WriteFile(filepath.Join(dir, c.Name), data[c.Name], 0o644); err != nil {
			return nil, err
		}
	}
	return list, nil
}
