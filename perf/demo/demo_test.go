package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
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

	var svg bytes.Buffer
	if err := renderSVG(&svg, res); err != nil {
		t.Fatal(err)
	}
	rects := 0
	d := xml.NewDecoder(&svg)
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("svg is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "rect" {
			rects++
		}
	}
	// background + 6+6 throughput bars + 6*3 latency bars + legend and labels
	if rects < 1+12+18 {
		t.Errorf("svg has %d rects, want >= 31", rects)
	}

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

func TestAxis(t *testing.T) {
	for _, tc := range []struct{ max, top float64 }{{1, 1}, {7, 8}, {1352, 1500}, {0, 1}} {
		scale, ticks := axis(tc.max, 100, 0)
		if got := 100 / scale; got < tc.max || got > tc.top*1.0001 {
			t.Errorf("axis(%v): top %v, want in [%v, %v]", tc.max, got, tc.max, tc.top)
		}
		if len(ticks) < 2 || ticks[0].Label != "0" {
			t.Errorf("axis(%v): ticks %+v", tc.max, ticks)
		}
	}
}

func TestLogAxis(t *testing.T) {
	h, ticks := logAxis(1.3, 1200, 300, 0)
	if len(ticks) != 5 || ticks[0].Label != "1" || ticks[4].Label != "10000" {
		t.Fatalf("ticks %+v", ticks)
	}
	// Decades are evenly spaced and values map monotonically.
	if !(h(1.3) < h(13) && h(13) < h(1200)) || h(1200) > 300 {
		t.Errorf("heights %v %v %v", h(1.3), h(13), h(1200))
	}
	if d := h(100) - h(10); math.Abs(d-75) > 0.01 {
		t.Errorf("one decade is %v px, want 75", d)
	}
}
