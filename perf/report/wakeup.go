package report

import "fmt"

// The wakeup section (issue #19, docs/wakeup.md): BenchmarkWakeup in
// perf/ reports ping over exn0 and over veth at 1, 5 and 50 per second
// ("pingR-p50-{veth,exn}-ms", "pingR-worst-..."), exnctl ping cold and
// warm beside a C FIFO ping-pong floor ("fping-cold-p50-us",
// "fifo-floor-cold-us", ...) and, cold, beside the same ping-pong
// between two Go processes ("go-floor-cold-us"), sockperf 64 B p50 ("sockperf64-p50-...")
// and the idle share of the busier exnd ("idle-max-pct");
// BenchmarkWakeupIdleScale the mean idle share with 2 and with 32 nodes
// ("idle-mean-Nnodes-pct").

var wakeupSection = Section{
	ID: "wakeup", Title: "Wake-ups: exn0 and the fabric at low rates, and idle",
	About: "Two namespaces running exnd on one shm fabric against a veth pair between two other namespaces, in one run: ping over exn0 at 1, 5 and 50 per second (p50 and worst), `exnctl ping` after a second of quiet (cold) and back to back (warm) beside the floor of any parking design (two C processes ping-ponging through FIFOs, parked in poll) and, cold, beside the same ping-pong between two Go processes parked in the netpoller (the floor of a Go program that parks), sockperf TCP ping-pong with 64-byte messages, each exnd's idle CPU time over 10 s as a share of the wall time, and the mean idle share with 2 and with 32 idle nodes on one fabric. Design: docs/wakeup.md.",
	Root:  true, Needs: []string{"ip", "ping", "sockperf", "gcc"},
	Env:     secsEnv(),
	Args:    bench("^BenchmarkWakeup(IdleScale)?$", "1x", "1x", "./perf/", "-timeout", "30m"),
	Extract: extractWakeup,
}

func extractWakeup(st *Stream, cmd string) ([]Result, []string) {
	aggs := Aggregate(st.Benches)
	var out []Result
	add := func(a *Agg, r Result) {
		r.Suite, r.Command, r.Samples = "wakeup", cmd, a.Samples
		if r.Baseline > 0 {
			r.Ratio = r.Value / r.Baseline
		}
		out = append(out, r)
	}
	if a, ok := aggs["Wakeup"]; ok {
		m := a.Metrics
		for _, rate := range []int{1, 5, 50} {
			k := fmt.Sprintf("ping%d", rate)
			name := fmt.Sprintf("ping over exn0, %d/s", rate)
			add(a, Result{Name: name, Metric: "p50", Value: m[k+"-p50-exn-ms"] * 1e6, Unit: "ns", Baseline: m[k+"-p50-veth-ms"] * 1e6, BaselineName: "veth", Bar: "wake-ping-p50"})
			bar := ""
			if rate == 5 {
				bar = "wake-ping-worst"
			}
			add(a, Result{Name: name, Metric: "worst", Value: m[k+"-worst-exn-ms"] * 1e6, Unit: "ns", Baseline: m[k+"-worst-veth-ms"] * 1e6, BaselineName: "veth", Bar: bar})
		}
		add(a, Result{Name: "exnctl ping, cold (after 1 s quiet)", Metric: "p50", Value: m["fping-cold-p50-us"] * 1e3, Unit: "ns", Baseline: m["fifo-floor-cold-us"] * 1e3, BaselineName: "C FIFO ping-pong after 1 s (floor)", Bar: "wake-fping-cold"})
		if g := m["go-floor-cold-us"]; g > 0 {
			add(a, Result{Name: "exnctl ping, cold (after 1 s quiet)", Metric: "p50", Value: m["fping-cold-p50-us"] * 1e3, Unit: "ns", Baseline: g * 1e3, BaselineName: "Go FIFO ping-pong after 1 s, netpoller (Go floor)"})
		}
		add(a, Result{Name: "exnctl ping, warm (back to back)", Metric: "p50", Value: m["fping-warm-p50-us"] * 1e3, Unit: "ns", Baseline: m["fifo-floor-warm-us"] * 1e3, BaselineName: "C FIFO ping-pong back to back (floor)"})
		add(a, Result{Name: "sockperf TCP ping-pong 64 B over exn0", Metric: "p50", Value: m["sockperf64-p50-exn-us"] * 1e3, Unit: "ns", Baseline: m["sockperf64-p50-veth-us"] * 1e3, BaselineName: "veth", Bar: "wake-sockperf"})
		add(a, Result{Name: "exnd idle CPU share, 10 s (busier of 2 nodes)", Metric: "share", Value: m["idle-max-pct"], Unit: "%", Bar: "wake-idle"})
	}
	if a, ok := aggs["WakeupIdleScale"]; ok {
		m := a.Metrics
		add(a, Result{Name: "exnd idle CPU share, mean of 32 nodes", Metric: "share", Value: m["idle-mean-32nodes-pct"], Unit: "%", Baseline: m["idle-mean-2nodes-pct"], BaselineName: "mean of 2 nodes", Bar: "wake-idle-scale"})
	}
	return out, nil
}
