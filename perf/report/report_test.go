package report

import (
	"encoding/xml"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseBenchLine(t *testing.T) {
	tests := []struct {
		line    string
		ok      bool
		name    string
		n       int64
		metrics map[string]float64
	}{
		{line: "BenchmarkFabric/VELO/pingpong-120B-2  2000  2963 ns/op  220.0 p50-ns  7080 p99-ns  4 B/op  0 allocs/op", ok: true,
			name: "Fabric/VELO/pingpong-120B", n: 2000,
			metrics: map[string]float64{"ns/op": 2963, "p50-ns": 220, "p99-ns": 7080, "B/op": 4, "allocs/op": 0}},
		{line: "BenchmarkTransmit/frame-65549-2 \t 20000\t 4452 ns/op\t 14724.00 MB/s\t 0.265 x-memcpy", ok: true,
			name: "Transmit/frame-65549", n: 20000, metrics: map[string]float64{"ns/op": 4452, "MB/s": 14724, "x-memcpy": 0.265}},
		{line: "BenchmarkX", ok: false},
		{line: "BenchmarkX-2 notanumber 1 ns/op", ok: false},
		{line: "BenchmarkX-2 10 1 ns/op odd", ok: false},
		{line: "--- BENCH: BenchmarkX", ok: false},
		{line: "ok  \tgithub.com/x/y\t1.2s", ok: false},
	}
	for _, tt := range tests {
		b, ok := ParseBenchLine(tt.line)
		if ok != tt.ok {
			t.Errorf("%q: ok = %v, want %v", tt.line, ok, tt.ok)
			continue
		}
		if !ok {
			continue
		}
		if b.Name != tt.name || b.N != tt.n || len(b.Metrics) != len(tt.metrics) {
			t.Errorf("%q: got %+v", tt.line, b)
		}
		for u, v := range tt.metrics {
			if b.Metrics[u] != v {
				t.Errorf("%q: %s = %v, want %v", tt.line, u, b.Metrics[u], v)
			}
		}
	}
}

// TestParseJSON feeds a go test -json stream in which test2json split a
// benchmark line over two output events, as it does for -count runs.
func TestParseJSON(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"start","Package":"p"}`,
		`{"Action":"output","Package":"p","Test":"BenchmarkFabric/VELO/rate-120B","Output":"BenchmarkFabric/VELO/rate-120B-2   \t"}`,
		`{"Action":"output","Package":"p","Output":"  100\t  80.5 ns/op\t 12400000 msgs/s\n"}`,
		`{"Action":"output","Package":"p","Output":"BenchmarkFabric/VELO/rate-120B-2 100 90.5 ns/op 11000000 msgs/s\n"}`,
		`{"Action":"output","Package":"p","Test":"TestNeedsRoot","Output":"    x_test.go:9: needs root\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestNeedsRoot"}`,
		`{"Action":"fail","Package":"q"}`,
		`not json: a build error`,
	}, "\n")
	st, err := ParseJSON(strings.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Benches) != 2 || st.Benches[0].Metrics["msgs/s"] != 12400000 || st.Benches[0].Pkg != "p" {
		t.Fatalf("benches %+v", st.Benches)
	}
	if len(st.Skips) != 1 || !strings.Contains(st.Skips[0], "needs root") {
		t.Errorf("skips %q", st.Skips)
	}
	if len(st.Failed) != 1 || st.Failed[0] != "q" {
		t.Errorf("failed %q", st.Failed)
	}
	agg := Aggregate(st.Benches)["Fabric/VELO/rate-120B"]
	if agg == nil || agg.Samples != 2 || agg.Metrics["ns/op"] != 85.5 {
		t.Fatalf("aggregate %+v", agg)
	}
	if s := agg.Spread["ns/op"]; math.Abs(s-10/85.5) > 1e-9 {
		t.Errorf("spread %v", s)
	}
}

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		in   []float64
		want float64
	}{{[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}, {[]float64{7}, 7}} {
		if got := Median(tt.in); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) is not NaN")
	}
}

func TestEvaluate(t *testing.T) {
	tests := []struct {
		r    Result
		want Status
	}{
		{Result{Bar: "shm-velo-p50", Value: 900}, StatusStretch},
		{Result{Bar: "shm-velo-p50", Value: 1500}, StatusPass},
		{Result{Bar: "shm-velo-p50", Value: 2500}, StatusMiss},
		{Result{Bar: "iperf3-exn0", Value: 8, Baseline: 16, Ratio: 0.5}, StatusPass},
		{Result{Bar: "iperf3-exn0", Value: 6, Baseline: 16, Ratio: 0.375}, StatusMiss},
		{Result{Bar: "iperf3-exn0", Value: 6}, StatusNone}, // a ratio bar needs a baseline
		{Result{Bar: "sockperf-p50-exn0", Value: 50, Baseline: 23, Ratio: 50.0 / 23}, StatusPass},
		{Result{Bar: "idle-cpu", Value: 2.6}, StatusMiss},
		{Result{Bar: "no-such-bar", Value: 1}, StatusNone},
	}
	for _, tt := range tests {
		if got := Evaluate(tt.r); got != tt.want {
			t.Errorf("Evaluate(%+v) = %q, want %q", tt.r, got, tt.want)
		}
	}
	for _, tg := range Targets {
		switch tg.Op {
		case "<=", ">=", "<", ">":
		default:
			t.Errorf("target %s: unknown operator %q", tg.ID, tg.Op)
		}
	}
}

func TestSectionRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	in := &SectionFile{Section: "fabric-shm", Title: "Raw fabric: shm", Count: 3,
		Results: []Result{{Suite: "fabric-shm", Name: "RMA get 64 KiB", Metric: "bandwidth", Value: 49000, Unit: "MB/s", Baseline: 57500, Ratio: 0.85, Bar: "shm-rma-get"}}}
	if err := in.Save(dir); err != nil {
		t.Fatal(err)
	}
	got, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := got["fabric-shm"]
	if out == nil || len(out.Results) != 1 || out.Results[0] != in.Results[0] {
		t.Fatalf("round trip: %+v", out)
	}
	if none, err := LoadDir(filepath.Join(dir, "missing")); err != nil || len(none) != 0 {
		t.Errorf("missing dir: %v, %v", none, err)
	}
}

func TestChartsAreWellFormedSVG(t *testing.T) {
	lc := LineChart{Title: "RMA bandwidth", XLabel: "bytes", YLabel: "MB/s", YFormat: fmtBytesRate,
		Series: []Series{{Name: "get", Pts: []Pt{{496, 3000}, {65536, 49000}, {8 << 20, 27000}}}, {Name: "memcpy <&>", Dash: true, Pts: []Pt{{496, 87000}, {8 << 20, 27000}}}}}
	bc := BarChart{Title: "latency", YLabel: "ns", YFormat: fmtNs, Bars: []string{"p50", "p99"},
		Groups: []BarGroup{{Label: "VELO\nshm", Values: []float64{1000, 1200}}, {Label: "TCP exn0", Values: []float64{50000, math.NaN()}}}}
	for name, svg := range map[string][]byte{"line": lc.SVG(), "bar": bc.SVG()} {
		d := xml.NewDecoder(strings.NewReader(string(svg)))
		elems := 0
		for {
			tok, err := d.Token()
			if err != nil {
				if err.Error() == "EOF" {
					break
				}
				t.Fatalf("%s chart is not well-formed XML: %v", name, err)
			}
			if _, ok := tok.(xml.StartElement); ok {
				elems++
			}
		}
		if elems < 10 {
			t.Errorf("%s chart has only %d elements", name, elems)
		}
	}
}

// TestChartDefaults: charts without colours or a formatter still render.
func TestChartDefaults(t *testing.T) {
	lc := LineChart{Title: "t", Series: []Series{{Name: "s", Pts: []Pt{{64, 1}, {1024, 10}}}}}
	bc := BarChart{Title: "t", Bars: []string{"a"}, Groups: []BarGroup{{Label: "g", Values: []float64{5, 7}}}}
	if len(lc.SVG()) == 0 || len(bc.SVG()) == 0 {
		t.Fatal("empty chart")
	}
}
