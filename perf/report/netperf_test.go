package report

import (
	"strings"
	"testing"
)

func TestExtractNetperf(t *testing.T) {
	line := "BenchmarkNetperf-2 1 0 ns/op 3 reps" +
		" 30000 TCP_RR-veth-trans-per-s 6000 TCP_RR-exn0-trans-per-s 7000 TCP_RR-shim-trans-per-s" +
		" 30 TCP_RR-veth-p50-us 150 TCP_RR-exn0-p50-us 120 TCP_RR-shim-p50-us" +
		" 40 TCP_RR-veth-p90-us 200 TCP_RR-exn0-p90-us 180 TCP_RR-shim-p90-us" +
		" 90 TCP_RR-veth-p99-us 400 TCP_RR-exn0-p99-us 900 TCP_RR-shim-p99-us" +
		" 10000 TCP_CRR-veth-trans-per-s 1000 TCP_CRR-exn0-trans-per-s 150 TCP_CRR-shim-trans-per-s" +
		" 80 TCP_CRR-veth-p50-us 700 TCP_CRR-exn0-p50-us 6000 TCP_CRR-shim-p50-us" +
		" 90 TCP_CRR-veth-p90-us 1300 TCP_CRR-exn0-p90-us 9000 TCP_CRR-shim-p90-us" +
		" 200 TCP_CRR-veth-p99-us 5000 TCP_CRR-exn0-p99-us 14000 TCP_CRR-shim-p99-us" +
		" 20000 TCP_STREAM-veth-Mbit-per-s 6000 TCP_STREAM-exn0-Mbit-per-s 9000 TCP_STREAM-shim-Mbit-per-s"
	b, ok := ParseBenchLine(line)
	if !ok {
		t.Fatal("bench line not parsed")
	}
	res, _ := extractNetperf(&Stream{Benches: []Bench{b}}, "cmd")
	// 3 tests x 3 rate rows, 2 RR tests x 3 percentiles x 2 rows.
	if len(res) != 9+12 {
		t.Fatalf("%d results, want 21: %+v", len(res), res)
	}
	for _, tc := range []struct {
		name, metric, base string
		value, ratio       float64
		status             Status
	}{
		{"netperf TCP_RR, shim", "rate", "TCP over exn0", 7000, 7000.0 / 6000, StatusMiss},
		{"netperf TCP_CRR, shim", "rate", "TCP over exn0", 150, 0.15, StatusMiss},
		{"netperf TCP_STREAM, shim", "throughput", "TCP over exn0", 9000, 1.5, StatusPass},
		{"netperf TCP_STREAM, shim", "throughput", "veth", 9000, 0.45, StatusMiss},
		{"netperf TCP_RR, TCP over exn0", "rate", "veth", 6000, 0.2, StatusNone},
		{"netperf TCP_CRR round trip, shim", "p90", "TCP over exn0", 9e6, 9000.0 / 1300, StatusNone},
	} {
		found := false
		for _, r := range res {
			if r.Name != tc.name || r.Metric != tc.metric || r.BaselineName != tc.base {
				continue
			}
			found = true
			if r.Value != tc.value || r.Ratio < tc.ratio*0.999 || r.Ratio > tc.ratio*1.001 || r.Samples != 3 || Evaluate(r) != tc.status {
				t.Errorf("%s %s vs %s: value %v ratio %v samples %d status %q; want %v, %v, 3, %q",
					tc.name, tc.metric, tc.base, r.Value, r.Ratio, r.Samples, Evaluate(r), tc.value, tc.ratio, tc.status)
			}
		}
		if !found {
			t.Errorf("no %s %s vs %s", tc.name, tc.metric, tc.base)
		}
	}
	c, ok := netperfChart(res)
	if !ok || len(c.Groups) != 3 || c.Groups[2].Values[2] != 0.45 {
		t.Errorf("chart: %v %+v", ok, c.Groups)
	}
	if svg := string(c.SVG()); !strings.Contains(svg, "TCP_CRR") {
		t.Error("chart lacks TCP_CRR")
	}
}
