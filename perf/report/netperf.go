package report

import (
	"math"
	"strings"

	"github.com/exn-project/exn/perf/svgchart"
)

// The netperf section (issue #15): BenchmarkNetperf in perf/ reports, per
// netperf test and way (veth, exn0, shim), the median rate
// ("TEST-WAY-trans-per-s" or "TEST-WAY-Mbit-per-s") and, for RR tests,
// the round-trip latency percentiles ("TEST-WAY-p50-us", p90, p99).

var netperfSection = Section{
	ID: "netperf", Title: "netperf: the shim vs TCP over exn0 vs veth",
	About: "Unmodified netperf (TCP_RR, TCP_CRR, TCP_STREAM; RR latency percentiles from the omni selectors, round trip) between two namespaces running exnd on one shm fabric: through libextds.so at both ends (EXT-DS), plain TCP over exn0, and TCP over a veth pair between the same namespaces, interleaved in one run. Needs `make netperf`. Where TCP_CRR's setup time goes, and the daemonizing-server fault: docs/shim.md.",
	Root:  true, Needs: []string{"ip", "ss", "gcc"},
	// One repetition per run: -count gives the repetitions (and the
	// samples the medians are taken over), each run interleaving the ways.
	Env: func(p Params) []string {
		return []string{"EXN_PERF_SECS=" + pick(p, "2", "4"), "EXN_PERF_REPS=1"}
	},
	Args:    bench("^BenchmarkNetperf$", "1x", "1x", "./perf/", "-timeout", "30m"),
	Extract: extractNetperf,
}

// netperfTests are the tests of the section, with the bars on
// the shim (against TCP over exn0, and the goal against veth or exn0).
var netperfTests = []struct {
	test, unit, metric, bar, goal string
}{
	{"TCP_RR", "trans-per-s", "rate", "netperf-rr-shim", "netperf-rr-shim-veth"},
	{"TCP_CRR", "trans-per-s", "rate", "netperf-crr-shim", ""},
	{"TCP_STREAM", "Mbit-per-s", "throughput", "netperf-stream-shim", "netperf-stream-shim-veth"},
}

func extractNetperf(st *Stream, cmd string) ([]Result, []string) {
	a, ok := Aggregate(st.Benches)["Netperf"]
	if !ok {
		return nil, nil
	}
	m := a.Metrics
	samples := a.Samples * int(max(m["reps"], 1))
	var out []Result
	add := func(r Result) {
		r.Suite, r.Command, r.Samples = "netperf", cmd, samples
		if r.Baseline > 0 && !math.IsNaN(r.Baseline) {
			r.Ratio = r.Value / r.Baseline
		}
		out = append(out, r)
	}
	for _, t := range netperfTests {
		v := func(way string) float64 { return m[t.test+"-"+way+"-"+t.unit] }
		if v("shim") == 0 {
			continue
		}
		unit := strings.ReplaceAll(t.unit, "-per-", "/")
		name := "netperf " + t.test
		add(Result{Name: name + ", shim", Metric: t.metric, Value: v("shim"), Unit: unit, Baseline: v("exn0"), BaselineName: "TCP over exn0", Bar: t.bar, Series: "shim"})
		add(Result{Name: name + ", shim", Metric: t.metric, Value: v("shim"), Unit: unit, Baseline: v("veth"), BaselineName: "veth", Bar: t.goal, Series: "shim"})
		add(Result{Name: name + ", TCP over exn0", Metric: t.metric, Value: v("exn0"), Unit: unit, Baseline: v("veth"), BaselineName: "veth", Series: "exn0"})
		if setup := v("shimsetup"); setup > 0 {
			add(Result{Name: name + ", shim, every connection EXT-DS (holds off)", Metric: t.metric, Value: setup, Unit: unit, Baseline: v("exn0"), BaselineName: "TCP over exn0", Series: "shim"})
		}
		if !strings.HasSuffix(t.test, "RR") {
			continue
		}
		for _, p := range []string{"p50", "p90", "p99"} {
			l := func(way string) float64 { return m[t.test+"-"+way+"-"+p+"-us"] * 1e3 }
			add(Result{Name: name + " round trip, shim", Metric: p, Value: l("shim"), Unit: "ns", Baseline: l("exn0"), BaselineName: "TCP over exn0"})
			add(Result{Name: name + " round trip, TCP over exn0", Metric: p, Value: l("exn0"), Unit: "ns", Baseline: l("veth"), BaselineName: "veth"})
		}
	}
	return out, nil
}

// netperfChart is every netperf test's rate relative to veth in the same
// run (veth = 1), so that transactions/s and Mbit/s share one axis.
func netperfChart(all []Result) (svgchart.BarChart, bool) {
	c := svgchart.BarChart{Title: "netperf relative to veth (same run)", YLabel: "rate / veth's (log scale)", YFormat: func(v float64) string { return svgchart.TrimNum(v) + "×" },
		Bars: []string{"veth", "TCP over exn0", "shim (EXT-DS)"}, Colors: []string{svgchart.Palette[6], svgchart.Palette[1], svgchart.Palette[0]},
		Note: "higher is better; 2 netns nodes on shm; TCP_RR/TCP_CRR transactions/s, TCP_STREAM throughput"}
	for _, t := range netperfTests {
		name := "netperf " + t.test
		exn0, ok1 := find(all, "netperf", name+", TCP over exn0", t.metric)
		var shim Result
		ok2 := false
		for _, r := range all {
			if r.Suite == "netperf" && r.Name == name+", shim" && r.Metric == t.metric && r.BaselineName == "veth" {
				shim, ok2 = r, true
			}
		}
		if !ok1 || !ok2 || exn0.Ratio == 0 || shim.Ratio == 0 {
			continue
		}
		c.Groups = append(c.Groups, svgchart.BarGroup{Label: t.test, Values: []float64{1, exn0.Ratio, shim.Ratio}})
	}
	return c, len(c.Groups) > 0
}
