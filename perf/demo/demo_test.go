package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/perf/svgchart"
)

func TestRun(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var steps int
	res, err := Run(ctx, Options{Nodes: 3, Duration: 100 * time.Millisecond, RoundTrips: 100,
		Progress: func(done, total int, what string) {
			steps++
			if total != 6 || done > total {
				t.Errorf("progress %d/%d %q", done, total, what)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pairs) != 6 || steps < 12 {
		t.Fatalf("%d pairs, %d progress steps; want 6 pairs, >= 12 steps", len(res.Pairs), steps)
	}
	for _, p := range res.Pairs {
		if p.From == p.To || p.Bytes <= 0 || p.MBps <= 0 || p.RoundTrips != 100 || p.Minus <= 0 || p.P50us < p.Minus || p.P99us < p.P50us {
			t.Errorf("implausible pair %+v", p)
		}
	}
	if sp := res.Sampling; sp.Rule != "all" || sp.Measured != 6 || sp.Total != 6 || sp.Senders != 3 || sp.Receivers != 3 {
		t.Errorf("sampling %+v; want all 6 pairs", sp)
	}
	if res.EngineRx == 0 {
		t.Error("no rendezvous frames: the throughput test did not use large frames")
	}
	// EXT-DS ran on every pair (a fallback to TCP is an error in Run).
	for _, p := range res.Pairs {
		if d := p.DS; d == nil || d.Bytes <= 0 || d.MBps <= 0 || d.RoundTrips != 100 || d.Minus <= 0 || d.P50us < d.Minus || d.P99us < d.P50us {
			t.Errorf("implausible EXT-DS result for %s -> %s: %+v", p.From, p.To, p.DS)
		}
	}

	dir := t.TempDir()
	jp := filepath.Join(dir, "r.json")
	if err := WriteJSON(jp, res); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(jp)
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil || len(back.Pairs) != 6 || back.Pairs[0].MBps != res.Pairs[0].MBps {
		t.Fatalf("json round trip: %v, %+v", err, back)
	}

	svg := renderSVG(res)
	if _, err := svgchart.WellFormed(svg); err != nil {
		t.Fatal(err)
	}
	checkBars(t, svg, res)

	var tbl bytes.Buffer
	if err := WriteTable(&tbl, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10.88.0.1", "10.88.0.3", "rtt p50", "6 pairs", "EXT-DS MB/s", "EXT-DS: throughput median"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
}

func TestRunErrors(t *testing.T) {
	for _, o := range []Options{
		{Nodes: 1, Duration: time.Second, RoundTrips: 1},
		{Nodes: 2, Duration: 0, RoundTrips: 1},
		{Nodes: 2, Duration: time.Second, RoundTrips: 0},
		{Nodes: 2, Duration: time.Second, RoundTrips: 1, MTU: 1 << 20},
	} {
		if _, err := Run(context.Background(), o); err == nil {
			t.Errorf("Run(%+v): no error", o)
		}
	}
}

// checkBars counts the chart's bars (each carries a <title> tooltip): one
// throughput bar per pair and path, p50 and p99 per pair and path, and
// checks that every pair and path is labelled.
func checkBars(t *testing.T, svg []byte, r *Result) {
	t.Helper()
	want := 0
	for _, p := range r.Pairs {
		want += 3 // TCP throughput, p50, p99
		if p.DS != nil {
			want += 3
		}
	}
	if got := bytes.Count(svg, []byte("<title>")); got != want {
		t.Errorf("svg has %d bars, want %d", got, want)
	}
	for _, p := range r.Pairs {
		if l := short(p.From) + "→" + short(p.To); !bytes.Contains(svg, []byte(">"+l+"<")) {
			t.Errorf("svg lacks the pair label %q", l)
		}
	}
	if hasDS(r) && !bytes.Contains(svg, []byte(">EXT-DS p99<")) {
		t.Error("svg lacks the EXT-DS legend")
	}
}

// A pair without EXT-DS figures leaves gaps, not zero bars, and the chart
// grows with the number of pairs.
func TestSVGMissingDS(t *testing.T) {
	r := &Result{Nodes: 2, Fabric: "mem", MTU: 65521, DurationS: 1}
	for i := range 30 {
		p := Pair{From: "10.88.0.1", To: fmt.Sprintf("10.88.0.%d", i+2), MBps: 1000 + float64(i), P50us: 40, P99us: 300}
		if i%2 == 0 {
			p.DS = &PathResult{MBps: 3000, P50us: 4, P99us: 30}
		}
		r.Pairs = append(r.Pairs, p)
	}
	svg := renderSVG(r)
	if _, err := svgchart.WellFormed(svg); err != nil {
		t.Fatal(err)
	}
	checkBars(t, svg, r)
	if want := fmt.Sprintf(`width="%d"`, 110+30*demoSlotDense); !bytes.Contains(svg, []byte(want)) {
		t.Errorf("svg lacks %s", want)
	}
	if bytes.Contains(svg, []byte("NaN")) {
		t.Error("svg has NaN coordinates")
	}
}

// checkPairs checks the invariants of a pair sample of n nodes: no
// self-pairs, no duplicates, indices in range, sorted, every node a
// sender and a receiver; a sampled one (not all) holds the ring and
// 1+peers pairs per sender.
func checkPairs(tb testing.TB, n int, pairs []Edge, all bool, peers int) {
	tb.Helper()
	seen := map[Edge]bool{}
	out, in := make([]int, n), make([]int, n)
	for i, e := range pairs {
		switch {
		case e.From < 0 || e.From >= n || e.To < 0 || e.To >= n:
			tb.Fatalf("pair %v out of range 0..%d", e, n-1)
		case e.From == e.To:
			tb.Errorf("self-pair %v", e)
		case seen[e]:
			tb.Errorf("duplicate pair %v", e)
		case i > 0 && (pairs[i-1].From > e.From || pairs[i-1].From == e.From && pairs[i-1].To > e.To):
			tb.Errorf("pairs not sorted at %d: %v after %v", i, e, pairs[i-1])
		}
		seen[e] = true
		out[e.From]++
		in[e.To]++
	}
	for i := range n {
		if out[i] == 0 || in[i] == 0 {
			tb.Errorf("node %d: %d pairs as sender, %d as receiver; want both > 0", i, out[i], in[i])
		}
		if all {
			continue
		}
		if !seen[Edge{i, (i + 1) % n}] {
			tb.Errorf("ring pair %d -> %d missing", i, (i+1)%n)
		}
		if out[i] != 1+peers {
			tb.Errorf("node %d sends to %d peers, want %d", i, out[i], 1+peers)
		}
	}
}

func TestSamplePairs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		s     Sampling
		count int
		all   bool
		peers int // random peers per node when sampled
	}{
		{"two nodes", 2, Sampling{}, 2, true, 0},
		{"default 4 nodes: all", 4, Sampling{}, 12, true, 0},
		{"default up to 8 nodes: all", 8, Sampling{Seed: 1}, 56, true, 0},
		{"9 nodes: ring and 2 peers", 9, Sampling{Seed: 1}, 27, false, 2},
		{"64 nodes: ring and 2 peers", 64, Sampling{Seed: 1}, 192, false, 2},
		{"64 nodes: ring and 5 peers", 64, Sampling{Peers: 5, Seed: 9}, 384, false, 5},
		{"ring only", 10, Sampling{AllUpTo: -1, Peers: -1}, 10, false, 0},
		{"always sample, small", 4, Sampling{AllUpTo: -1, Peers: 1}, 8, false, 1},
		{"peers cover every pair", 5, Sampling{AllUpTo: -1, Peers: 3}, 20, true, 0},
		{"raised threshold", 12, Sampling{AllUpTo: 12}, 132, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pairs, all, err := SamplePairs(tc.n, tc.s)
			if err != nil {
				t.Fatal(err)
			}
			if len(pairs) != tc.count || all != tc.all {
				t.Fatalf("%d pairs, all %v; want %d, %v", len(pairs), all, tc.count, tc.all)
			}
			checkPairs(t, tc.n, pairs, all, tc.peers)
			again, _, err := SamplePairs(tc.n, tc.s)
			if err != nil || !slices.Equal(pairs, again) {
				t.Errorf("not deterministic for seed %d: %v", tc.s.Seed, err)
			}
		})
	}
	if _, _, err := SamplePairs(1, Sampling{}); err == nil {
		t.Error("SamplePairs(1): no error")
	}
	a, _, _ := SamplePairs(64, Sampling{Seed: 1})
	b, _, _ := SamplePairs(64, Sampling{Seed: 2})
	if slices.Equal(a, b) {
		t.Error("seeds 1 and 2 drew the same peers")
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestPercentile(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{[]float64{1, 2, 3, 4, 5}, 50, 3},
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{7}, 10, 7},
		{[]float64{0, 10}, 10, 1},
		{[]float64{0, 10}, 90, 9},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9.1},
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10, 1.9},
		{[]float64{3, 5, 8}, 0, 3},
		{[]float64{3, 5, 8}, 100, 8},
		{nil, 50, nan},
		{[]float64{1, 2}, -1, nan},
		{[]float64{1, 2}, 101, nan},
		{[]float64{1, 2}, nan, nan},
	} {
		got := Percentile(tc.xs, tc.p)
		if math.IsNaN(tc.want) != math.IsNaN(got) || !math.IsNaN(got) && !near(got, tc.want) {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.xs, tc.p, got, tc.want)
		}
	}
}

func TestDistribution(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want Dist
	}{
		{"empty", nil, Dist{}},
		{"only NaN", []float64{math.NaN()}, Dist{}},
		{"one", []float64{4}, Dist{N: 1, Min: 4, P10: 4, Median: 4, P90: 4, Max: 4}},
		{"unsorted with NaN", []float64{10, 1, math.NaN(), 5, 3, 7, 2, 9, 4, 8, 6},
			Dist{N: 10, Min: 1, P10: 1.9, Median: 5.5, P90: 9.1, Max: 10}},
	} {
		in := slices.Clone(tc.xs)
		got := Distribution(in)
		if got.N != tc.want.N || !near(got.Min, tc.want.Min) || !near(got.P10, tc.want.P10) || !near(got.Median, tc.want.Median) ||
			!near(got.P90, tc.want.P90) || !near(got.Max, tc.want.Max) {
			t.Errorf("%s: Distribution = %+v, want %+v", tc.name, got, tc.want)
		}
		if len(in) > 0 && !math.IsNaN(in[0]) && in[0] != tc.xs[0] {
			t.Errorf("%s: input reordered", tc.name)
		}
	}
}

func TestSummarize(t *testing.T) {
	pairs := []Pair{
		{MBps: 100, P50us: 20, DS: &PathResult{MBps: 400, P50us: 2}},
		{MBps: 300, P50us: 40, DS: &PathResult{MBps: 800, P50us: 2}},
	}
	s := Summarize(pairs)
	if s.TCPMBps.N != 2 || s.TCPMBps.Median != 200 || s.TCPP50us.Median != 30 {
		t.Errorf("TCP: %+v %+v", s.TCPMBps, s.TCPP50us)
	}
	if s.DSMBps == nil || s.DSMBps.Median != 600 || s.DSP50us.Median != 2 || s.RTTRatio == nil ||
		!near(s.RTTRatio.Min, 0.05) || !near(s.RTTRatio.Max, 0.1) {
		t.Errorf("EXT-DS: %+v %+v %+v", s.DSMBps, s.DSP50us, s.RTTRatio)
	}
	if s := Summarize([]Pair{{MBps: 1, P50us: 1}}); s.DSMBps != nil || s.RTTRatio != nil {
		t.Error("EXT-DS distributions without EXT-DS figures")
	}
}

func TestParseLoadavg(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want LoadAvg
		ok   bool
	}{
		{"0.41 0.83 1.17 1/82 21529\n", LoadAvg{0.41, 0.83, 1.17}, true},
		{"12.00 3.5 0", LoadAvg{12, 3.5, 0}, true},
		{"0.41 0.83", LoadAvg{}, false},
		{"", LoadAvg{}, false},
		{"a 0.83 1.17 1/82 1", LoadAvg{}, false},
		{"0.4 -1 1.17 1/82 1", LoadAvg{}, false},
		{"0.4 NaN 1.17 1/82 1", LoadAvg{}, false},
	} {
		got, err := parseLoadavg(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseLoadavg(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestPlanTests(t *testing.T) {
	for _, tc := range []struct {
		name         string
		pairs, paths int
		d            time.Duration
		rounds       int
		budget       time.Duration
		wantD        time.Duration // 0: check the estimate fits the budget instead
		wantRounds   int
	}{
		{"no budget", 4032, 2, time.Second, 2000, 0, time.Second, 2000},
		{"fits", 12, 2, time.Second, 2000, 120 * time.Second, time.Second, 2000},
		{"64 nodes", 192, 2, time.Second, 2000, 120 * time.Second, 0, 0},
		{"one path", 192, 1, time.Second, 2000, 60 * time.Second, 0, 0},
		{"floors", 4032, 2, time.Second, 2000, 10 * time.Second, minDuration, minRoundTrips},
		{"not raised to the floors", 4032, 2, 10 * time.Millisecond, 50, time.Second, 10 * time.Millisecond, 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanTests(tc.pairs, tc.paths, tc.d, tc.rounds, tc.budget)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantD != 0 {
				if p.Duration != tc.wantD || p.RoundTrips != tc.wantRounds {
					t.Errorf("plan %+v; want %v, %d round trips", p, tc.wantD, tc.wantRounds)
				}
				return
			}
			if p.Scale >= 1 || p.Duration >= tc.d || p.RoundTrips >= tc.rounds {
				t.Errorf("plan %+v: not scaled down", p)
			}
			if p.Estimate > tc.budget || p.Estimate < tc.budget*99/100 {
				t.Errorf("plan %+v: estimate %v, want just under %v", p, p.Estimate, tc.budget)
			}
		})
	}
	for _, bad := range [][5]int{{0, 2, 1, 1, 0}, {1, 0, 1, 1, 0}, {1, 2, 0, 1, 0}, {1, 2, 1, 0, 0}, {1, 2, 1, 1, -1}} {
		if _, err := PlanTests(bad[0], bad[1], time.Duration(bad[2]), bad[3], time.Duration(bad[4])); err == nil {
			t.Errorf("PlanTests%v: no error", bad)
		}
	}
}

// A sampled run measures the sampled pairs, and its JSON says how many of
// how many, and the machine's CPUs and load.
func TestRunSampled(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := Sampling{AllUpTo: -1, Peers: 1, Seed: 3}
	res, err := Run(ctx, Options{Nodes: 5, Duration: 50 * time.Millisecond, RoundTrips: 50, Sampling: s})
	if err != nil {
		t.Fatal(err)
	}
	edges, _, err := SamplePairs(5, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pairs) != len(edges) {
		t.Fatalf("%d pairs, want %d", len(res.Pairs), len(edges))
	}
	for i, e := range edges {
		if from, to := fmt.Sprintf("10.88.0.%d", e.From+1), fmt.Sprintf("10.88.0.%d", e.To+1); res.Pairs[i].From != from || res.Pairs[i].To != to {
			t.Errorf("pair %d: %s -> %s, want %s -> %s", i, res.Pairs[i].From, res.Pairs[i].To, from, to)
		}
	}

	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var j struct {
		Sampling map[string]any `json:"sampling"`
		Machine  map[string]any `json:"machine"`
		Summary  map[string]Dist
	}
	if err := json.Unmarshal(b, &j); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"rule": "ring+random", "pairs_measured": 10.0, "pairs_total": 20.0,
		"senders": 5.0, "receivers": 5.0, "random_peers_per_node": 1.0, "seed": 3.0, "scale": 1.0} {
		if got := j.Sampling[k]; got != want {
			t.Errorf("json sampling.%s = %v, want %v", k, got, want)
		}
	}
	if got := j.Machine["num_cpu"]; got != float64(runtime.NumCPU()) {
		t.Errorf("json machine.num_cpu = %v, want %d", got, runtime.NumCPU())
	}
	if got := j.Machine["gomaxprocs"]; got != float64(runtime.GOMAXPROCS(0)) {
		t.Errorf("json machine.gomaxprocs = %v, want %d", got, runtime.GOMAXPROCS(0))
	}
	_, statErr := os.Stat(loadavgPath)
	for _, k := range []string{"loadavg_start", "loadavg_end"} {
		la, ok := j.Machine[k].(map[string]any)
		switch {
		case statErr == nil && (!ok || la["1m"] == nil || la["5m"] == nil || la["15m"] == nil):
			t.Errorf("json machine.%s = %v, want the 1m/5m/15m load", k, j.Machine[k])
		case statErr != nil && j.Machine["loadavg_error"] == nil:
			t.Errorf("no %s and no loadavg_error", k)
		}
	}
	for _, k := range []string{"tcp_throughput_mb_s", "tcp_rtt_p50_us", "extds_throughput_mb_s", "extds_rtt_p50_us", "extds_tcp_rtt_p50_ratio"} {
		if d := j.Summary[k]; d.N != 10 || d.Median <= 0 || d.P10 > d.Median || d.Median > d.P90 {
			t.Errorf("json summary.%s = %+v", k, d)
		}
	}

	var tbl bytes.Buffer
	if err := WriteTable(&tbl, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"10 of 20 ordered pairs", "1 random peers per node", "load average", "GOMAXPROCS",
		"distribution across 10 pairs (of 20)", "EXT-DS/TCP rtt p50 ratio", "p90"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
}

// Beyond chartPairsMax pairs the chart draws the distribution: five
// groups, whatever the number of pairs, at the default width.
func TestSVGDistribution(t *testing.T) {
	r := &Result{Nodes: 64, Fabric: "mem", MTU: 65521, DurationS: 0.3, Sampling: SamplingInfo{Total: 4032}}
	for i := range chartPairsMax + 1 {
		r.Pairs = append(r.Pairs, Pair{From: "10.88.0.1", To: fmt.Sprintf("10.88.0.%d", i+2), MBps: 1000 + float64(i),
			P50us: 20, P99us: 60, DS: &PathResult{MBps: 9000, P50us: 2, P99us: 20}})
	}
	svg := renderSVG(r)
	if _, err := svgchart.WellFormed(svg); err != nil {
		t.Fatal(err)
	}
	// 5 groups: 2 throughput bars and 4 latency bars each.
	if got, want := bytes.Count(svg, []byte("<title>")), 5*(2+4); got != want {
		t.Errorf("svg has %d bars, want %d", got, want)
	}
	for _, want := range []string{">median<", ">p90<", "49 sampled pairs (of 4032)", fmt.Sprintf(`width="%d"`, svgchart.DefaultWidth)} {
		if !bytes.Contains(svg, []byte(want)) {
			t.Errorf("svg lacks %q", want)
		}
	}
	if bytes.Contains(svg, []byte("1→2<")) {
		t.Error("svg labels single pairs")
	}
}
