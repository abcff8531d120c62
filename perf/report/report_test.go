package report

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/perf/svgchart"
)

// Lines captured from real runs of the exn benchmarks.
func TestParseBenchLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		name string
		n    int64
		want map[string]float64
	}{
		{"BenchmarkFabric/VELO/pingpong-120B-2         \t    2000\t      2963 ns/op\t       220.0 p50-ns\t      7080 p99-ns\t       4 B/op\t       0 allocs/op",
			"Fabric/VELO/pingpong-120B", 2000, map[string]float64{"ns/op": 2963, "p50-ns": 220, "p99-ns": 7080, "B/op": 4, "allocs/op": 0}},
		{"BenchmarkFabric/RMA/get-64KiB-2               \t       1\t      4887 ns/op\t13410.27 MB/s\t      1548 memcpy-ns\t         0.3248 x-memcpy\t       0 B/op\t       0 allocs/op",
			"Fabric/RMA/get-64KiB", 1, map[string]float64{"ns/op": 4887, "MB/s": 13410.27, "memcpy-ns": 1548, "x-memcpy": 0.3248, "B/op": 0, "allocs/op": 0}},
		{"BenchmarkFabric/VELO/rate-120B-2              \t       1\t     51025 ns/op\t   2.35 MB/s\t     19824 msgs/s\t    8736 B/op\t       3 allocs/op",
			"Fabric/VELO/rate-120B", 1, map[string]float64{"ns/op": 51025, "MB/s": 2.35, "msgs/s": 19824, "B/op": 8736, "allocs/op": 3}},
		{"BenchmarkStream/tcp/64B-2         \t    2000\t      7613 ns/op\t   8.41 MB/s\t       0 B/op\t       0 allocs/op",
			"Stream/tcp/64B", 2000, map[string]float64{"ns/op": 7613, "MB/s": 8.41, "B/op": 0, "allocs/op": 0}},
		{"BenchmarkPingPong/extds/64B-2  \t 2000\t 1402 ns/op\t 0.7012 p50-µs\t 2.810 p99-µs\t 3 B/op\t 0 allocs/op",
			"PingPong/extds/64B", 2000, map[string]float64{"ns/op": 1402, "p50-µs": 0.7012, "p99-µs": 2.81, "B/op": 3, "allocs/op": 0}},
		{"BenchmarkExtEth-2   \t       1\t         0 ns/op\t         0.8124 idle-cpu-%\t         9.100 iperf3-TCP-1-streams-exn-Gbit/s\t         0.4500 iperf3-TCP-1-streams-ratio\t        20.20 iperf3-TCP-1-streams-veth-Gbit/s",
			"ExtEth", 1, map[string]float64{"ns/op": 0, "idle-cpu-%": 0.8124, "iperf3-TCP-1-streams-exn-Gbit/s": 9.1, "iperf3-TCP-1-streams-ratio": 0.45, "iperf3-TCP-1-streams-veth-Gbit/s": 20.2}},
	} {
		b, ok := ParseBenchLine(tc.line)
		if !ok {
			t.Errorf("%q: not parsed", tc.line)
			continue
		}
		if b.Name != tc.name || b.N != tc.n || !reflect.DeepEqual(b.Metrics, tc.want) {
			t.Errorf("%q:\n got %s %d %v\nwant %s %d %v", tc.line, b.Name, b.N, b.Metrics, tc.name, tc.n, tc.want)
		}
	}
	for _, l := range []string{
		"BenchmarkFabric",
		"BenchmarkFabric/VELO/pingpong-120B",
		"BenchmarkStream/tcp/64B-2         \t",
		"=== RUN   BenchmarkFabric",
		"PASS",
		"ok  \tgithub.com/exn-project/exn/fabric/mem\t0.043s",
		"    exteth_test.go:129: iperf3/sockperf 4 s each, 2 CPUs",
	} {
		if b, ok := ParseBenchLine(l); ok {
			t.Errorf("%q parsed as %+v", l, b)
		}
	}
}

// A -count 2 run as go test -json printed it: the first result line split
// in two events (name, then numbers), the second without a Test field.
const capturedJSON = `{"Time":"2026-11-21T05:39:38.69Z","Action":"start","Package":"github.com/exn-project/exn/extds"}
{"Time":"2026-11-21T05:39:38.696497911Z","Action":"output","Package":"github.com/exn-project/exn/extds","Test":"BenchmarkStream","Output":"=== RUN   BenchmarkStream\n"}
{"Time":"2026-11-21T05:39:38.696500344Z","Action":"output","Package":"github.com/exn-project/exn/extds","Test":"BenchmarkStream","Output":"BenchmarkStream\n"}
{"Time":"2026-11-21T05:39:38.697619164Z","Action":"output","Package":"github.com/exn-project/exn/extds","Test":"BenchmarkStream/tcp/64B","Output":"=== RUN   BenchmarkStream/tcp/64B\n"}
{"Time":"2026-11-21T05:39:38.697622479Z","Action":"output","Package":"github.com/exn-project/exn/extds","Test":"BenchmarkStream/tcp/64B","Output":"BenchmarkStream/tcp/64B\n"}
{"Time":"2026-11-21T05:39:38.718917232Z","Action":"output","Package":"github.com/exn-project/exn/extds","Test":"BenchmarkStream/tcp/64B","Output":"BenchmarkStream/tcp/64B-2         \t"}
{"Time":"2026-11-21T05:39:38.718988848Z","Action":"output","Package":"github.com/exn-project/exn/extds","Test":"BenchmarkStream/tcp/64B","Output":"    2000\t      5575 ns/op\t  11.48 MB/s\t       0 B/op\t       0 allocs/op\n"}
{"Time":"2026-11-21T05:39:38.739280854Z","Action":"output","Package":"github.com/exn-project/exn/extds","Output":"BenchmarkStream/tcp/64B-2         \t    2000\t      7613 ns/op\t   8.41 MB/s\t       0 B/op\t       0 allocs/op\n"}
{"Time":"2026-11-21T05:39:38.739301645Z","Action":"output","Package":"github.com/exn-project/exn/extds","Output":"PASS\n"}
{"Time":"2026-11-21T05:39:38.740167269Z","Action":"output","Package":"github.com/exn-project/exn/extds","Output":"ok  \tgithub.com/exn-project/exn/extds\t0.058s\n"}
{"Time":"2026-11-21T05:39:38.740215009Z","Action":"pass","Package":"github.com/exn-project/exn/extds","Elapsed":0.059}
`

func TestParseJSON(t *testing.T) {
	st, err := ParseJSON(strings.NewReader(capturedJSON))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Benches) != 2 {
		t.Fatalf("got %d benches, want 2: %+v", len(st.Benches), st.Benches)
	}
	for _, b := range st.Benches {
		if b.Name != "Stream/tcp/64B" || b.Pkg != "github.com/exn-project/exn/extds" || b.N != 2000 {
			t.Errorf("bench %+v", b)
		}
	}
	ag := Aggregate(st.Benches)["Stream/tcp/64B"]
	if ag.Samples != 2 || ag.Metrics["MB/s"] != (11.48+8.41)/2 || ag.Metrics["ns/op"] != (5575+7613)/2 {
		t.Errorf("aggregate %+v", ag)
	}
	if s := ag.Spread["MB/s"]; math.Abs(s-(11.48-8.41)/((11.48+8.41)/2)) > 1e-9 {
		t.Errorf("spread %v", s)
	}
}

func TestParseJSONSkipAndFail(t *testing.T) {
	in := `{"Action":"output","Package":"p","Test":"BenchmarkExtEth","Output":"=== RUN   BenchmarkExtEth\n"}
{"Action":"output","Package":"p","Test":"BenchmarkExtEth","Output":"    exteth_test.go:36: needs root\n"}
{"Action":"output","Package":"p","Test":"BenchmarkExtEth","Output":"--- SKIP: BenchmarkExtEth\n"}
{"Action":"skip","Package":"p","Test":"BenchmarkExtEth"}
# github.com/exn-project/exn/perf [build failed]
{"Action":"fail","Package":"q"}
`
	st, err := ParseJSON(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Skips) != 1 || st.Skips[0] != "BenchmarkExtEth: exteth_test.go:36: needs root" {
		t.Errorf("skips %q", st.Skips)
	}
	if len(st.Failed) != 1 || st.Failed[0] != "q" {
		t.Errorf("failed %q", st.Failed)
	}
	if !strings.Contains(strings.Join(st.Lines, "\n"), "[build failed]") {
		t.Errorf("non-JSON line lost: %q", st.Lines)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if !math.IsNaN(Median(nil)) {
		t.Error("Median(nil) not NaN")
	}
}

func TestTargets(t *testing.T) {
	for _, tc := range []struct {
		r    Result
		want Status
	}{
		{Result{Bar: "shm-velo-p50", Value: 491, Unit: "ns"}, StatusStretch},
		{Result{Bar: "shm-velo-p50", Value: 1500, Unit: "ns"}, StatusPass},
		{Result{Bar: "shm-velo-p50", Value: 2000, Unit: "ns"}, StatusPass},
		{Result{Bar: "shm-velo-p50", Value: 2001, Unit: "ns"}, StatusMiss},
		{Result{Bar: "shm-rma-get", Value: 6, Baseline: 10, Ratio: 0.6}, StatusPass},
		{Result{Bar: "shm-rma-get", Value: 9, Baseline: 10, Ratio: 0.9}, StatusStretch},
		{Result{Bar: "shm-rma-get", Value: 4, Baseline: 10, Ratio: 0.4}, StatusMiss},
		{Result{Bar: "shm-rma-get", Value: 4}, StatusNone}, // no baseline, no verdict
		{Result{Bar: "sockperf-p50-exn0", Value: 40, Baseline: 10, Ratio: 4}, StatusMiss},
		{Result{Bar: "sockperf-p50-exn0", Value: 14, Baseline: 10, Ratio: 1.4}, StatusStretch},
		{Result{Bar: "idle-cpu", Value: 2, Unit: "%"}, StatusMiss},
		{Result{Bar: "idle-cpu", Value: 0.3, Unit: "%"}, StatusStretch},
		{Result{Bar: "iperf3-shim", Value: 3, Baseline: 3, Ratio: 1}, StatusPass},
		{Result{Value: 3}, StatusNone},
	} {
		if got := Evaluate(tc.r); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.r, got, tc.want)
		}
	}
	seen := map[string]bool{}
	for _, tg := range Targets {
		if seen[tg.ID] {
			t.Errorf("duplicate target %s", tg.ID)
		}
		seen[tg.ID] = true
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	in := &SectionFile{Section: "fabric-shm", Title: "Raw fabric: shm", Command: "go test x", Count: 3,
		Time: time.Date(2026, 11, 21, 5, 0, 0, 0, time.UTC), Machine: "m", Notes: []string{"n"},
		Results: []Result{{Suite: "fabric-shm", Name: "RMA get 64 KiB", Metric: "bandwidth", Value: 1, Unit: "MB/s", Baseline: 2, Ratio: 0.5, Command: "go test x", Size: 65536, Series: "get", Bar: "shm-rma-get", Samples: 3}}}
	if err := in.Save(dir); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "fabric-shm.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"suite"`, `"name"`, `"metric"`, `"value"`, `"unit"`, `"baseline"`, `"ratio"`, `"command"`} {
		if !bytes.Contains(b, []byte(k)) {
			t.Errorf("saved JSON has no %s key:\n%s", k, b)
		}
	}
	got, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got["fabric-shm"], in) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got["fabric-shm"], in)
	}
	if m, err := LoadDir(filepath.Join(dir, "none")); err != nil || len(m) != 0 {
		t.Errorf("missing dir: %v %v", m, err)
	}
}

func TestShimRows(t *testing.T) {
	lines := []string{
		"    shim_test.go:459: 4 s each, 2 CPUs",
		"        | measurement | shim (EXT-DS) | TCP over exn0 | TCP over veth | shim / exn0 |",
		"        |---|---|---|---|---|",
		"        | iperf3, 1 stream | 3.10 Gbit/s | 2.50 Gbit/s | 9.80 Gbit/s | 1.24x |",
		"        | sockperf ping-pong p50 | 12.00 us | 30.00 us | 15.00 us | 0.40x |",
		"| iperf3, 1 stream | 2.90 Gbit/s | 2.70 Gbit/s | 9.00 Gbit/s | 1.07x |",
		"| iperf3, 1 stream | 3.30 Gbit/s | 2.60 Gbit/s | 9.50 Gbit/s | 1.27x |",
	}
	order, units, runs := ShimRows(lines)
	if !reflect.DeepEqual(order, []string{"iperf3, 1 stream", "sockperf ping-pong p50"}) || units["sockperf ping-pong p50"] != "us" || len(runs["iperf3, 1 stream"]) != 3 {
		t.Fatalf("order %q units %v runs %v", order, units, runs)
	}
	rs, _ := extractShim(&Stream{Lines: lines}, "cmd")
	r, ok := find(rs, "shim", "iperf3, 1 stream", "throughput")
	if !ok || r.Value != 3.1 || r.Baseline != 2.6 || r.Bar != "iperf3-shim" || r.Samples != 3 {
		t.Errorf("iperf3 row %+v", r)
	}
	var p50 []Result
	for _, r := range rs {
		if r.Metric == "p50" {
			p50 = append(p50, r)
		}
	}
	if len(p50) != 2 || p50[0].Value != 12000 || p50[0].Baseline != 30000 || p50[1].Baseline != 15000 || p50[0].Unit != "ns" {
		t.Errorf("p50 rows %+v", p50)
	}
}

func TestSectionCommands(t *testing.T) {
	s, _ := SectionByID("fabric-shm")
	p := Params{Count: 3}
	if got, want := s.Command(p), "go test -run '^$' -bench '^BenchmarkFabric$' -benchtime 500ms -count 3 ./fabric/shm/"; got != want {
		t.Errorf("command\n got %s\nwant %s", got, want)
	}
	args := s.GoArgs(p)
	if args[0] != "test" || args[len(args)-1] != "./fabric/shm/" || args[len(args)-2] != "-json" {
		t.Errorf("go args %q", args)
	}
	sh, _ := SectionByID("shim")
	if c := sh.Command(Params{Quick: true, Count: 1}); !strings.HasPrefix(c, "EXN_PERF=1 EXN_PERF_SECS=2 go test -run '^TestShimPerf$'") {
		t.Errorf("shim command %s", c)
	}
	o := Options{Only: []string{"fabric", "extds"}}
	sel, err := o.Selected()
	if err != nil || len(sel) != 4 {
		t.Errorf("selected %d, %v", len(sel), err)
	}
	o.Only = []string{"nope"}
	if _, err := o.Selected(); err == nil {
		t.Error("unknown section accepted")
	}
}

// fixture is a small set of results from every section.
func fixture() []*SectionFile {
	now := time.Date(2026, 11, 21, 6, 0, 0, 0, time.UTC)
	mk := func(id string, rs []Result) *SectionFile {
		s, _ := SectionByID(id)
		cmd := s.Command(Params{Count: 3})
		for i := range rs {
			rs[i].Suite, rs[i].Command, rs[i].Samples = id, cmd, 3
		}
		return &SectionFile{Section: id, Title: s.Title, Command: cmd, Count: 3, Time: now, Machine: "AMD EPYC, 2 vCPUs", Results: rs}
	}
	var files []*SectionFile
	for i, be := range []string{"mem", "shm", "net"} {
		scale := []float64{1, 0.8, 0.05}[i]
		rs := []Result{
			{Name: "VELO ping-pong 120 B, one way", Metric: "p50", Value: []float64{220, 491, 23000}[i], Unit: "ns", Series: "VELO " + be},
			{Name: "VELO ping-pong 120 B, one way", Metric: "p99", Value: []float64{300, 55700, 150000}[i], Unit: "ns", Series: "VELO " + be},
		}
		if be == "shm" {
			rs[0].Bar = "shm-velo-p50"
		}
		for _, op := range []string{"get", "put"} {
			for _, sz := range []int{496, 4 << 10, 64 << 10, 1 << 20, 8 << 20} {
				base := 20000.0
				v := base * scale * float64(sz) / float64(8<<20+sz) * 2
				r := Result{Name: "RMA " + op + " " + svgchart.SizeName(sz), Metric: "bandwidth", Value: v, Unit: "MB/s", Baseline: base, Ratio: v / base, BaselineName: "memcpy", Size: sz, Series: op}
				if be == "shm" && op == "get" && sz >= 64<<10 {
					r.Bar = "shm-rma-get"
				}
				rs = append(rs, r)
			}
		}
		files = append(files, mk("fabric-"+be, rs))
	}
	files = append(files, mk("extds", []Result{
		{Name: "ping-pong 64 B, one way", Metric: "p50", Value: 700, Unit: "ns", Baseline: 6500, Ratio: 700.0 / 6500, BaselineName: "TCP loopback", Size: 64, Series: "pingpong"},
		{Name: "ping-pong 64 B, one way", Metric: "p99", Value: 2800, Unit: "ns", Baseline: 9100, Ratio: 2800.0 / 9100, BaselineName: "TCP loopback", Size: 64, Series: "pingpong"},
		{Name: "stream, 64 B writes", Metric: "throughput", Value: 90, Unit: "MB/s", Baseline: 11, Ratio: 90.0 / 11, BaselineName: "TCP loopback", Size: 64, Series: "stream"},
		{Name: "stream, 1 MiB writes", Metric: "throughput", Value: 9000, Unit: "MB/s", Baseline: 3000, Ratio: 3, BaselineName: "TCP loopback", Size: 1 << 20, Series: "stream"},
	}))
	files = append(files, mk("exteth-tap", []Result{
		{Name: "iperf3 TCP, 1 stream", Metric: "throughput", Value: 4, Unit: "Gbit/s", Baseline: 20, Ratio: 0.2, BaselineName: "veth", Bar: "iperf3-exn0"},
		{Name: "sockperf TCP ping-pong, one way", Metric: "p50", Value: 30000, Unit: "ns", Baseline: 15000, Ratio: 2, BaselineName: "veth", Bar: "sockperf-p50-exn0", Series: "TCP over exn0"},
		{Name: "sockperf TCP ping-pong, one way", Metric: "p99", Value: 90000, Unit: "ns", Baseline: 40000, Ratio: 2.25, BaselineName: "veth", Series: "TCP over exn0"},
		{Name: "exnd idle CPU (max of 2 nodes, 5 s)", Metric: "cpu", Value: 0.4, Unit: "%", Bar: "idle-cpu"},
	}))
	files = append(files, &SectionFile{Section: "shim", Title: "EXT-DS through the LD_PRELOAD shim vs TCP over exn0 vs veth", Command: "EXN_PERF=1 go test ...", Count: 3, Time: now, Skipped: "needs root (network namespaces)"})
	return files
}

func TestMarkdown(t *testing.T) {
	files := fixture()
	charts, _ := Charts(files)
	doc := Markdown(files, DocOptions{Note: "Other builds were running.", Charts: charts, ResultsDir: "results"})
	for _, want := range []string{
		"# Benchmarks",
		"AMD EPYC, 2 vCPUs",
		"median of 3 run(s)",
		"Other builds were running.",
		"![One-way latency by path (half a ping-pong round trip)](charts/latency.svg)",
		"## Performance targets (docs/design.md)",
		// shm p50 491 ns: bar ≤ 2 µs and stretch ≤ 1 µs met.
		"| shm VELO 120 B ping-pong p50 | ≤ 2 µs | ≤ 1 µs | 491 ns |  |  | pass, stretch met | [fabric-shm](#raw-fabric-shm) |",
		// iperf3 at 0.2× veth misses 0.5×.
		"| 4.00 Gbit/s | 20.0 Gbit/s veth | 0.2× | **miss** |",
		// sockperf p50 at 2× veth passes ≤ 3× but not the 1.5× stretch.
		"| 30.0 µs | 15.0 µs veth | 2.00× | pass |",
		// The library bar is derived from extds and exteth-tap: 700 ns / 30 µs.
		"| EXT-DS (library) p50 latency | ≤ 0.5× TCP over exn0 | ≤ veth | 700 ns | 30.0 µs TCP over exn0 | 0.0233× | pass |",
		"| iperf3 through libextds.so | ≥ 1.0× TCP over exn0 | ≥ 1.0× veth | not measured |",
		"## Raw fabric: shm",
		"go test -run '^$' -bench '^BenchmarkFabric$' -benchtime 500ms -count 3 ./fabric/shm/",
		"| RMA get 64 KiB | bandwidth |",
		"![RMA bandwidth by transfer size](charts/rma-bandwidth.svg)",
		"![EXT-DS stream throughput by write size](charts/extds-stream.svg)",
		"**Skipped:** needs root (network namespaces)",
		"Not run yet: `exteth-engine`, `netstack`, `netperf`, `wakeup`.",
		"go run ./cmd/exnperf report -from docs/results",
	} {
		if !strings.Contains(doc, want) {
			t.Errorf("document lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(doc)
	}
	// Every table row has the header's column count.
	var cols int
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(l, "|") {
			cols = 0
			continue
		}
		n := strings.Count(strings.ReplaceAll(l, `\|`, ""), "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("row has %d separators, header %d: %s", n, cols, l)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		unit string
		want string
	}{
		{220, "ns", "220 ns"}, {55700, "ns", "55.7 µs"}, {1.5e6, "ns", "1.50 ms"},
		{13410.27, "MB/s", "13.4 GB/s"}, {8.41, "MB/s", "8.41 MB/s"},
		{14177451, "msgs/s", "14.2 M msg/s"}, {0.81, "%", "0.81 % of a core"}, {9.1, "Gbit/s", "9.10 Gbit/s"},
		{math.NaN(), "ns", "—"},
	} {
		if got := FormatValue(tc.v, tc.unit); got != tc.want {
			t.Errorf("FormatValue(%v, %s) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
	if FormatRatio(0.486) != "0.486×" || FormatRatio(0.0233) != "0.0233×" || FormatRatio(12.4) != "12.4×" || FormatRatio(0) != "" {
		t.Errorf("FormatRatio: %q %q", FormatRatio(0.486), FormatRatio(0))
	}
}

// wellFormed checks that b is a well-formed SVG document with some text.
func wellFormed(t *testing.T, name string, b []byte) {
	t.Helper()
	texts, err := svgchart.WellFormed(b)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if texts < 5 {
		t.Errorf("%s: %d text elements", name, texts)
	}
}

func TestChartsWellFormed(t *testing.T) {
	files := fixture()
	list, data := Charts(files)
	var names []string
	for _, c := range list {
		names = append(names, c.Name)
		wellFormed(t, c.Name, data[c.Name])
	}
	if !reflect.DeepEqual(names, []string{"latency.svg", "rma-bandwidth.svg", "extds-stream.svg"}) {
		t.Errorf("charts %q", names)
	}
	lat := string(data["latency.svg"])
	for _, want := range []string{"VELO 120 B", "TCP over exn0", "veth", "p50", "p99", "491 ns", "1 µs", "latency (log scale)"} {
		if !strings.Contains(lat, want) {
			t.Errorf("latency.svg lacks %q", want)
		}
	}
	rma := string(data["rma-bandwidth.svg"])
	for _, want := range []string{"shm GET", "net PUT", "memcpy", "64 KiB", "8 MiB", "GB/s", "transfer size (log scale)", "stroke-dasharray"} {
		if !strings.Contains(rma, want) {
			t.Errorf("rma-bandwidth.svg lacks %q", want)
		}
	}
}

func TestReportFrom(t *testing.T) {
	src, out := t.TempDir(), t.TempDir()
	for _, f := range fixture() {
		if err := f.Save(src); err != nil {
			t.Fatal(err)
		}
	}
	if err := Report(t.Context(), Options{From: src, Out: out}); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(out, "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "## Raw fabric: net") {
		t.Error("document lacks the net section")
	}
	for _, c := range []string{"latency.svg", "rma-bandwidth.svg", "extds-stream.svg"} {
		b, err := os.ReadFile(filepath.Join(out, "charts", c))
		if err != nil {
			t.Fatal(err)
		}
		wellFormed(t, c, b)
	}
	// -only with -from keeps just those sections.
	if err := Report(t.Context(), Options{From: src, Out: out, Only: []string{"extds"}}); err != nil {
		t.Fatal(err)
	}
	doc, _ = os.ReadFile(filepath.Join(out, "benchmarks.md"))
	if strings.Contains(string(doc), "## Raw fabric: net") || !strings.Contains(string(doc), "## EXT-DS library vs TCP loopback") {
		t.Error("-only extds -from: wrong sections")
	}
}

// TestAppendix: hand-written sections in benchmarks.d are appended in
// name order, verbatim; a missing folder is no appendix.
func TestAppendix(t *testing.T) {
	dir := t.TempDir()
	if a, err := readAppendix(filepath.Join(dir, "none")); err != nil || len(a) != 0 {
		t.Fatalf("missing folder: %q, %v", a, err)
	}
	for name, text := range map[string]string{"20-b.md": "## B\n\nsecond\n", "10-a.md": "## A\n\nfirst\n", "x.txt": "ignored"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := readAppendix(dir)
	if err != nil {
		t.Fatal(err)
	}
	doc := Markdown(nil, DocOptions{Appendix: a})
	ia, ib := strings.Index(doc, "## A\n\nfirst"), strings.Index(doc, "## B\n\nsecond")
	if ia < 0 || ib < ia || strings.Contains(doc, "ignored") {
		t.Fatalf("appendix not in order or not verbatim:\n%s", doc)
	}
}
