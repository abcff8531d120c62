package report

import (
	"bufio"
	"encoding/json"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Bench is one benchmark result line of go test: the name without the
// "Benchmark" prefix and the -GOMAXPROCS suffix, the iteration count, and
// every value/unit pair (ns/op, MB/s, B/op, allocs/op and the custom
// metrics of b.ReportMetric).
type Bench struct {
	Pkg     string
	Name    string // e.g. "Fabric/VELO/pingpong-120B"
	N       int64
	Metrics map[string]float64 // unit -> value
}

// testEvent is one line of go test -json (cmd/test2json).
type testEvent struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Stream is what a go test -json run printed: the benchmark results in
// order, the plain output lines, and the tests or benchmarks that were
// skipped with their reasons.
type Stream struct {
	Benches []Bench
	Lines   []string
	Skips   []string // "TestX: reason"
	Failed  []string // failing tests or packages
}

// ParseJSON reads a go test -json event stream. Output events are joined
// per package before splitting into lines, because test2json may split a
// benchmark line in two events (name, then numbers) and gives the
// second line of a -count run no Test field. Lines that are not JSON
// (a build error on stderr merged in) are kept as plain lines.
func ParseJSON(r io.Reader) (*Stream, error) {
	st := &Stream{}
	partial := map[string]*strings.Builder{}
	var order []string
	lastOut := map[string]string{} // test -> last non-empty output line
	flushLine := func(pkg, line string) {
		st.Lines = append(st.Lines, line)
		if b, ok := ParseBenchLine(line); ok {
			b.Pkg = pkg
			st.Benches = append(st.Benches, b)
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		raw := sc.Bytes()
		var ev testEvent
		if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &ev) != nil {
			flushLine("", string(raw))
			continue
		}
		switch ev.Action {
		case "output":
			sb := partial[ev.Package]
			if sb == nil {
				sb = &strings.Builder{}
				partial[ev.Package] = sb
				order = append(order, ev.Package)
			}
			sb.WriteString(ev.Output)
			s := sb.String()
			if i := strings.LastIndexByte(s, '\n'); i >= 0 {
				for _, l := range strings.Split(s[:i], "\n") {
					flushLine(ev.Package, l)
					if t := strings.TrimSpace(l); ev.Test != "" && t != "" && !strings.HasPrefix(t, "---") && !strings.HasPrefix(t, "===") {
						lastOut[ev.Test] = t
					}
				}
				sb.Reset()
				sb.WriteString(s[i+1:])
			}
		case "skip":
			if ev.Test != "" {
				st.Skips = append(st.Skips, ev.Test+": "+lastOut[ev.Test])
			}
		case "fail":
			name := ev.Package
			if ev.Test != "" {
				name += " " + ev.Test
			}
			st.Failed = append(st.Failed, name)
		}
	}
	for _, p := range order {
		if s := partial[p].String(); s != "" {
			flushLine(p, s)
		}
	}
	return st, sc.Err()
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// ParseBenchLine parses one benchmark result line:
//
//	BenchmarkFabric/VELO/pingpong-120B-2  2000  2963 ns/op  220.0 p50-ns  7080 p99-ns  4 B/op  0 allocs/op
func ParseBenchLine(line string) (Bench, bool) {
	if !strings.HasPrefix(line, "Benchmark") {
		return Bench{}, false
	}
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 {
		return Bench{}, false
	}
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return Bench{}, false
	}
	b := Bench{Name: procsSuffix.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), ""), N: n, Metrics: map[string]float64{}}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return Bench{}, false
		}
		b.Metrics[f[i+1]] = v
	}
	if len(b.Metrics) == 0 {
		return Bench{}, false
	}
	return b, true
}

// Agg is the median of every metric of one benchmark over its -count
// runs.
type Agg struct {
	Name    string
	Samples int
	Metrics map[string]float64
	Spread  map[string]float64 // (max-min)/median
}

// Aggregate groups benches by package and name and takes medians.
func Aggregate(bs []Bench) map[string]*Agg {
	vals := map[string]map[string][]float64{}
	var names []string
	for _, b := range bs {
		m := vals[b.Name]
		if m == nil {
			m = map[string][]float64{}
			vals[b.Name] = m
			names = append(names, b.Name)
		}
		for u, v := range b.Metrics {
			m[u] = append(m[u], v)
		}
	}
	out := map[string]*Agg{}
	for _, n := range names {
		a := &Agg{Name: n, Metrics: map[string]float64{}, Spread: map[string]float64{}}
		for u, vs := range vals[n] {
			a.Samples = max(a.Samples, len(vs))
			med := Median(vs)
			a.Metrics[u] = med
			if med != 0 && len(vs) > 1 {
				a.Spread[u] = (slices.Max(vs) - slices.Min(vs)) / math.Abs(med)
			}
		}
		out[n] = a
	}
	return out
}

// Median of v (NaN for none).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
