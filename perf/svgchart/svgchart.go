package svgchart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/exn-project/exn/internal/bytesize"
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

// BarChart draws grouped bars on a log10 Y axis, or a linear one from 0
// with Linear.
type BarChart struct {
	Title, YLabel string
	YFormat       func(float64) string
	Bars          []string // bar series names (legend)
	Colors        []string
	Groups        []BarGroup
	Note          string
	// Linear puts the Y axis on a linear scale from 0 (round steps)
	// instead of whole log10 decades.
	Linear bool
	// HideValues leaves out the value printed above each bar (the
	// tooltip keeps it): for charts with too many bars to label.
	HideValues bool
	// Width is the chart's width in pixels; below DefaultWidth (and 0) it
	// is DefaultWidth. Many groups want more.
	Width int
}

// Chart is a chart that renders to one SVG document of a known size.
type Chart interface {
	SVG() []byte
	Size() (width, height int)
}

// The default chart size in pixels.
const (
	DefaultWidth  = svgW
	DefaultHeight = svgH
)

const (
	svgW, svgH   = 820, 460
	plotL, plotT = 86, 62
	plotR, plotB = svgW - 190, svgH - 70 // plotR: with the legend at the right
)

// Palette: colour-blind-safe (Okabe–Ito).
var Palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"}

type svgBuf struct {
	bytes.Buffer
	width     int  // the document's width
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
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", w.width, svgH, w.width, svgH)
	fmt.Fprintf(w, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", w.width, svgH)
	w.text(float64(w.width)/2, 24, "middle", ` font-size="16" font-weight="bold"`, title)
	if note != "" {
		w.text(float64(w.width)/2, 42, "middle", ` font-size="11" fill="#555555"`, note)
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

// linearTicks picks a round step for an axis from 0 to at least hi, with
// two to five steps, and returns the step and the axis top.
func linearTicks(hi float64) (step, top float64) {
	if !(hi > 0) || math.IsInf(hi, 0) {
		hi = 1
	}
	step = math.Pow(10, math.Floor(math.Log10(hi)))
	for hi/step > 5 {
		step *= 2
	}
	for hi/step < 2 {
		step /= 2
	}
	return step, math.Ceil(hi/step) * step
}

// yAxisLinear draws gridlines and labels from 0 to at least hi and
// returns the Y mapping.
func (w *svgBuf) yAxisLinear(hi float64, label string, f func(float64) string) func(float64) float64 {
	step, top := linearTicks(hi)
	y := func(v float64) float64 { return plotB - v/top*(plotB-plotT) }
	for i := 0; float64(i)*step <= top*1.0001; i++ {
		v := float64(i) * step
		yy := y(v)
		fmt.Fprintf(w, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#cccccc"/>`+"\n", plotL, yy, w.right, yy)
		w.text(plotL-6, yy+4, "end", "", f(v))
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
		c.YFormat = TrimNum
	}
	w := svgBuf{width: svgW, right: plotR}
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

// Size is the line chart's size in pixels.
func (c LineChart) Size() (width, height int) { return svgW, svgH }

// Size is the bar chart's size in pixels.
func (c BarChart) Size() (width, height int) { return max(c.Width, svgW), svgH }

// SVG renders the bar chart.
func (c BarChart) SVG() []byte {
	if len(c.Colors) == 0 {
		c.Colors = Palette
	}
	if c.YFormat == nil {
		c.YFormat = TrimNum
	}
	width, _ := c.Size()
	// Bars use the full width, the legend goes above the plot.
	w := svgBuf{width: width, right: width - 24, legendTop: true}
	w.header(c.Title, c.Note)
	var vs []float64
	for _, g := range c.Groups {
		vs = append(vs, g.Values...)
	}
	var y func(float64) float64
	if c.Linear {
		hi := 0.0
		for _, v := range vs {
			if v > hi && !math.IsInf(v, 0) {
				hi = v
			}
		}
		y = w.yAxisLinear(hi, c.YLabel, c.YFormat)
	} else {
		lo, hi := logRange(vs)
		y = w.yAxis(lo, hi, c.YLabel, c.YFormat)
	}
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
			if !c.HideValues {
				w.text(bx+bw/2, by-4, "middle", ` font-size="9"`, c.YFormat(v))
			}
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

// FmtBytesRate labels an MB/s axis.
func FmtBytesRate(v float64) string {
	switch {
	case v >= 1000:
		return TrimNum(v/1000) + " GB/s"
	case v >= 1:
		return TrimNum(v) + " MB/s"
	}
	return TrimNum(v*1000) + " kB/s"
}

// FmtNs labels a nanosecond axis.
func FmtNs(v float64) string {
	switch {
	case v >= 1e6:
		return TrimNum(v/1e6) + " ms"
	case v >= 1e3:
		return TrimNum(v/1e3) + " µs"
	}
	return TrimNum(v) + " ns"
}

func TrimNum(v float64) string {
	if v >= 10 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

// SizeName formats a byte count as 64 B, 4 KiB, 1 MiB (bytesize.Name
// with a space).
func SizeName(n int) string { return bytesize.Name(n, " ") }

// Stack renders charts one above the other, left-aligned, as one SVG
// document as wide as the widest.
func Stack(charts ...Chart) []byte {
	width, height := 0, 0
	for _, c := range charts {
		w, h := c.Size()
		width, height = max(width, w), height+h
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`+"\n", width, height)
	y := 0
	for _, c := range charts {
		fmt.Fprintf(&b, `<g transform="translate(0 %d)">`+"\n", y)
		b.Write(c.SVG())
		b.WriteString("</g>\n")
		_, h := c.Size()
		y += h
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// WellFormed decodes every token of b and checks that its root is an svg
// element in the SVG namespace. It returns the number of text elements,
// for tests that want a chart to say something.
func WellFormed(b []byte) (texts int, err error) {
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return texts, fmt.Errorf("svgchart: not well-formed XML: %w", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
				if root != "svg" || se.Name.Space != "http://www.w3.org/2000/svg" {
					return texts, fmt.Errorf("svgchart: root element %q in namespace %q, want svg", root, se.Name.Space)
				}
			}
			if se.Name.Local == "text" {
				texts++
			}
		}
	}
	if root == "" {
		return 0, errors.New("svgchart: no root element")
	}
	return texts, nil
}
