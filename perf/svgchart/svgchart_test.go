package svgchart

import (
	"bytes"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func mustWellFormed(t *testing.T, name string, b []byte) int {
	t.Helper()
	texts, err := WellFormed(b)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, b)
	}
	return texts
}

// Text that needs escaping stays well-formed, and the text survives.
func TestEscaped(t *testing.T) {
	c := LineChart{Title: `a <b> & "c"`, YFormat: FmtBytesRate, Series: []Series{{Name: "x<y", Color: "#000", Pts: []Pt{{64, 1}, {4096, 100}}}}}
	b := c.SVG()
	mustWellFormed(t, "line", b)
	if !bytes.Contains(b, []byte("a &lt;b&gt; &amp; &#34;c&#34;")) || !bytes.Contains(b, []byte("x&lt;y")) {
		t.Errorf("escaped text missing:\n%s", b)
	}
	bc := BarChart{Title: "<t>", Bars: []string{"&"}, Groups: []BarGroup{{Label: "a\n<b>", Values: []float64{3}}}}
	mustWellFormed(t, "bar", bc.SVG())
}

// An empty chart does not divide by zero into NaN coordinates.
func TestEmptyNoNaN(t *testing.T) {
	for name, c := range map[string]Chart{
		"bar":        BarChart{Title: "empty", YFormat: FmtNs},
		"bar linear": BarChart{Title: "empty", Linear: true},
		"line":       LineChart{Title: "empty"},
		"all NaN":    BarChart{Title: "nan", Bars: []string{"a"}, Groups: []BarGroup{{Label: "g", Values: []float64{math.NaN()}}}, Linear: true},
	} {
		b := c.SVG()
		mustWellFormed(t, name, b)
		if bytes.Contains(b, []byte("NaN")) || bytes.Contains(b, []byte("Inf")) {
			t.Errorf("%s: chart has NaN or Inf: %s", name, b)
		}
	}
}

// Charts with no formatter or colours fall back to defaults.
func TestChartDefaults(t *testing.T) {
	lc := LineChart{Title: "t", Series: []Series{{Name: "s", Pts: []Pt{{64, 1}, {1024, 10}}}}}
	bc := BarChart{Title: "t", Bars: []string{"a"}, Groups: []BarGroup{{Label: "g", Values: []float64{5, 7}}}}
	if len(lc.SVG()) == 0 || len(bc.SVG()) == 0 {
		t.Fatal("empty chart")
	}
	if !bytes.Contains(bc.SVG(), []byte(`fill="`+Palette[0]+`"`)) {
		t.Error("bar chart without Colors does not use the palette")
	}
	if w, h := bc.Size(); w != DefaultWidth || h != DefaultHeight {
		t.Errorf("Size() = %d, %d", w, h)
	}
}

func TestLinearTicks(t *testing.T) {
	for _, tc := range []struct{ hi, top float64 }{{1, 1}, {7, 8}, {1352, 1500}, {3100, 4000}, {0, 1}, {math.Inf(1), 1}} {
		step, top := linearTicks(tc.hi)
		if top != tc.top {
			t.Errorf("linearTicks(%v): top %v, want %v", tc.hi, top, tc.top)
		}
		if n := top / step; n < 2 || n > 5 || n != math.Trunc(n) {
			t.Errorf("linearTicks(%v): %v steps of %v", tc.hi, n, step)
		}
	}
}

func TestLogRange(t *testing.T) {
	for _, tc := range []struct {
		vs     []float64
		lo, hi float64
	}{
		{[]float64{1.3, 1200}, 1, 10000},
		{[]float64{5, math.NaN(), -1, 0, math.Inf(1)}, 1, 10},
		{[]float64{100}, 100, 1000},
		{nil, 1, 10},
	} {
		lo, hi := logRange(tc.vs)
		if lo != tc.lo || hi != tc.hi {
			t.Errorf("logRange(%v) = %v, %v; want %v, %v", tc.vs, lo, hi, tc.lo, tc.hi)
		}
	}
}

var rectRE = regexp.MustCompile(`<rect x="([0-9.]+)" y="([0-9.]+)" width="([0-9.]+)" height="([0-9.]+)" fill="[^"]*"><title>([^<]*)</title>`)

// bars returns the height of every bar, by tooltip.
func bars(t *testing.T, b []byte) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, m := range rectRE.FindAllSubmatch(b, -1) {
		h, err := strconv.ParseFloat(string(m[4]), 64)
		if err != nil {
			t.Fatal(err)
		}
		out[string(m[5])] = h
	}
	return out
}

// On a linear axis bar heights are proportional to the values; on a log
// axis a decade is a fixed height.
func TestBarScales(t *testing.T) {
	g := []BarGroup{{Label: "g", Values: []float64{10, 20, 100}}}
	lin := bars(t, BarChart{Bars: []string{"a", "b", "c"}, Groups: g, Linear: true}.SVG())
	if len(lin) != 3 {
		t.Fatalf("linear: bars %v", lin)
	}
	if r := lin["g b: 20"] / lin["g a: 10"]; math.Abs(r-2) > 0.02 {
		t.Errorf("linear: 20 is %.3f× 10", r)
	}
	log := bars(t, BarChart{Bars: []string{"a", "b", "c"}, Groups: g}.SVG())
	// 10, 100 span one decade of a 10..100 axis: 10 is at the bottom.
	if log["g a: 10"] > 0.5 || log["g c: 100"] < 300 {
		t.Errorf("log: bars %v", log)
	}
}

func TestBarOptions(t *testing.T) {
	c := BarChart{Title: "t", Bars: []string{"a"}, Groups: []BarGroup{{Label: "g", Values: []float64{3}}, {Label: "h", Values: []float64{math.NaN()}}}, YFormat: func(v float64) string { return "V" + TrimNum(v) }}
	with := c.SVG()
	if !bytes.Contains(with, []byte(">V3</text>")) {
		t.Error("value label missing")
	}
	if n := bytes.Count(with, []byte("<title>")); n != 1 {
		t.Errorf("%d bars, want 1 (NaN is a gap)", n)
	}
	c.HideValues = true
	if bytes.Contains(c.SVG(), []byte(">V3</text>")) {
		t.Error("HideValues: value label still drawn")
	}
	c.Width = 2000
	if w, _ := c.Size(); w != 2000 || !bytes.Contains(c.SVG(), []byte(`width="2000"`)) {
		t.Errorf("Width 2000: Size %d", w)
	}
	c.Width = 100 // below the default: the default
	if w, _ := c.Size(); w != DefaultWidth {
		t.Errorf("Width 100: Size %d", w)
	}
}

func TestStack(t *testing.T) {
	a := BarChart{Title: "first", Bars: []string{"a"}, Groups: []BarGroup{{Label: "g", Values: []float64{5}}}, Width: 1000}
	b := LineChart{Title: "second", Series: []Series{{Name: "s", Pts: []Pt{{64, 1}, {1024, 10}}}}}
	s := Stack(a, b)
	texts := mustWellFormed(t, "stack", s)
	if texts < 10 {
		t.Errorf("%d text elements", texts)
	}
	head := string(s[:bytes.IndexByte(s, '\n')])
	if want := `width="1000" height="920"`; !strings.Contains(head, want) {
		t.Errorf("stack header %q lacks %s", head, want)
	}
	if !bytes.Contains(s, []byte(`<g transform="translate(0 460)">`)) {
		t.Error("second chart not placed below the first")
	}
	if i, j := bytes.Index(s, []byte(">first<")), bytes.Index(s, []byte(">second<")); i < 0 || j < i {
		t.Error("charts missing or out of order")
	}
}

func TestSizeName(t *testing.T) {
	for n, want := range map[int]string{64: "64 B", 1000: "1000 B", 4096: "4 KiB", 1 << 20: "1 MiB", 3 << 19: "1536 KiB"} {
		if got := SizeName(n); got != want {
			t.Errorf("SizeName(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestWellFormedRejects(t *testing.T) {
	for _, b := range []string{"", "<svg", `<html xmlns="http://www.w3.org/2000/svg"/>`, "<svg/>"} {
		if _, err := WellFormed([]byte(b)); err == nil {
			t.Errorf("WellFormed(%q): no error", b)
		}
	}
}
