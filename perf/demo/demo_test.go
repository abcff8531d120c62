package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
