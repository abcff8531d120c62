package report

import (
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/exn-project/exn/perf/svgchart"
)

// ChartFile is a chart written by WriteCharts.
type ChartFile struct {
	Name     string   // file name in charts/
	Title    string   // alt text
	Sections []string // sections it illustrates
	Headline bool     // shown at the top (and in the README)
}

// LatencyPath is one bar group of the latency chart: where its p50 and
// p99 come from.
type latencyPath struct {
	label       string
	suite, name string
	baseline    bool   // take the result's baseline, not its value
	baseName    string // with baseline: the BaselineName to match
}

var latencyPaths = []latencyPath{
	{label: "VELO 120 B\nmem", suite: "fabric-mem", name: "VELO ping-pong 120 B, one way"},
	{label: "VELO 120 B\nshm", suite: "fabric-shm", name: "VELO ping-pong 120 B, one way"},
	{label: "VELO 120 B\nnet (TCP lo)", suite: "fabric-net", name: "VELO ping-pong 120 B, one way"},
	{label: "EXT-DS lib\n64 B (mem)", suite: "extds", name: "ping-pong 64 B, one way"},
	{label: "TCP loopback\n64 B (Go)", suite: "extds", name: "ping-pong 64 B, one way", baseline: true, baseName: "TCP loopback"},
	{label: "EXT-DS shim\nsockperf", suite: "shim", name: "sockperf ping-pong, one way", baseName: "TCP over exn0"},
	{label: "TCP over exn0\nsockperf", suite: "exteth-tap", name: "sockperf TCP ping-pong, one way"},
	{label: "veth\nsockperf", suite: "exteth-tap", name: "sockperf TCP ping-pong, one way", baseline: true, baseName: "veth"},
}

func (p latencyPath) value(all []Result, metric string) float64 {
	for _, r := range all {
		if r.Suite != p.suite || r.Name != p.name || r.Metric != metric {
			continue
		}
		if p.baseName != "" && r.BaselineName != p.baseName {
			continue
		}
		if p.baseline {
			return r.Baseline
		}
		return r.Value
	}
	return math.NaN()
}

// fallback: TCP over exn0 and veth from the shim section when the TAP
// section did not run.
func latencyValue(all []Result, p latencyPath, metric string) float64 {
	v := p.value(all, metric)
	if !math.IsNaN(v) || p.suite != "exteth-tap" {
		return v
	}
	q := latencyPath{suite: "shim", name: "sockperf ping-pong, one way", baseline: true, baseName: "TCP over exn0"}
	if p.baseline {
		q.baseName = "veth"
	}
	return q.value(all, metric)
}

// Charts builds every chart the results allow, keyed by file name.
func Charts(files []*SectionFile) ([]ChartFile, map[string][]byte) {
	var all []Result
	for _, f := range files {
		all = append(all, f.Results...)
	}
	var list []ChartFile
	out := map[string][]byte{}
	add := func(f ChartFile, svg []byte) {
		list = append(list, f)
		out[f.Name] = svg
	}

	// Latency percentiles per path.
	lc := svgchart.BarChart{Title: "One-way latency by path (half a ping-pong round trip)", YLabel: "latency (log scale)", YFormat: svgchart.FmtNs,
		Bars: []string{"p50", "p99"}, Colors: []string{svgchart.Palette[0], svgchart.Palette[1]},
		Note: "lower is better; VELO = raw fabric message, EXT-DS = stream sockets, sockperf = TCP ping-pong between two netns"}
	var secs []string
	for _, p := range latencyPaths {
		p50, p99 := latencyValue(all, p, "p50"), latencyValue(all, p, "p99")
		if math.IsNaN(p50) && math.IsNaN(p99) {
			continue
		}
		lc.Groups = append(lc.Groups, svgchart.BarGroup{Label: p.label, Values: []float64{p50, p99}})
		secs = append(secs, p.suite)
	}
	if len(lc.Groups) > 0 {
		add(ChartFile{Name: "latency.svg", Title: lc.Title, Sections: secs, Headline: true}, lc.SVG())
	}

	// RMA bandwidth by size, per backend, with memcpy.
	rc := svgchart.LineChart{Title: "RMA bandwidth by transfer size", XLabel: "transfer size (log scale)", YLabel: "bandwidth (log scale)", YFormat: svgchart.FmtBytesRate,
		Note: "higher is better; one request in flight; solid = GET, dashed = PUT; memcpy = copy() of the same size in the same run"}
	memcpy := map[float64][]float64{}
	for i, be := range []string{"mem", "shm", "net"} {
		for _, op := range []string{"get", "put"} {
			s := svgchart.Series{Name: be + " " + strings.ToUpper(op), Color: svgchart.Palette[i], Dash: op == "put"}
			for _, r := range all {
				if r.Suite == "fabric-"+be && r.Series == op && r.Size > 0 {
					s.Pts = append(s.Pts, svgchart.Pt{X: float64(r.Size), Y: r.Value})
					if r.Baseline > 0 {
						memcpy[float64(r.Size)] = append(memcpy[float64(r.Size)], r.Baseline)
					}
				}
			}
			if len(s.Pts) > 0 {
				rc.Series = append(rc.Series, s)
			}
		}
	}
	if len(rc.Series) > 0 {
		s := svgchart.Series{Name: "memcpy (median)", Color: svgchart.Palette[6]}
		for x, vs := range memcpy {
			s.Pts = append(s.Pts, svgchart.Pt{X: x, Y: Median(vs)})
		}
		rc.Series = append(rc.Series, s)
		add(ChartFile{Name: "rma-bandwidth.svg", Title: rc.Title, Sections: []string{"fabric-mem", "fabric-shm", "fabric-net"}}, rc.SVG())
	}

	// EXT-DS stream throughput by write size vs TCP loopback.
	sc := svgchart.LineChart{Title: "EXT-DS stream throughput by write size", XLabel: "write size (log scale)", YLabel: "throughput (log scale)", YFormat: svgchart.FmtBytesRate,
		Note: "higher is better; one connection, one direction; EXT-DS over fabric/mem vs kernel TCP over loopback, same run"}
	sc.Series = bySize(all, func(r Result) bool { return r.Suite == "extds" && r.Series == "stream" },
		svgchart.Series{Name: "EXT-DS (mem)", Color: svgchart.Palette[0]}, svgchart.Series{Name: "TCP loopback", Color: svgchart.Palette[1], Dash: true})
	if sc.Series != nil {
		add(ChartFile{Name: "extds-stream.svg", Title: sc.Title, Sections: []string{"extds"}}, sc.SVG())
	}

	// EXT-Eth engine by frame size vs memcpy.
	ec := svgchart.LineChart{Title: "EXT-Eth engine throughput by frame size (fabric/mem)", XLabel: "Ethernet frame size (log scale)", YLabel: "throughput (log scale)", YFormat: svgchart.FmtBytesRate,
		Note: "higher is better; batches of 32 frames to the receiver's Link; memcpy = one copy() of the frame, same run"}
	ec.Series = bySize(all, func(r Result) bool { return r.Suite == "exteth-engine" && r.Size > 0 },
		svgchart.Series{Name: "engine", Color: svgchart.Palette[2]}, svgchart.Series{Name: "memcpy", Color: svgchart.Palette[6], Dash: true})
	if ec.Series != nil {
		add(ChartFile{Name: "exteth-engine.svg", Title: ec.Title, Sections: []string{"exteth-engine"}}, ec.SVG())
	}
	if nc, ok := netperfChart(all); ok { // netperf.go
		add(ChartFile{Name: "netperf.svg", Title: nc.Title, Sections: []string{"netperf"}}, nc.SVG())
	}
	return list, out
}

// bySize is the two lines of a chart by size: the values of the results
// match picks, as value, and their same-run baselines, as base. It is nil
// if nothing matches.
func bySize(all []Result, match func(Result) bool, value, base svgchart.Series) []svgchart.Series {
	for _, r := range all {
		if !match(r) {
			continue
		}
		value.Pts = append(value.Pts, svgchart.Pt{X: float64(r.Size), Y: r.Value})
		if r.Baseline > 0 {
			base.Pts = append(base.Pts, svgchart.Pt{X: float64(r.Size), Y: r.Baseline})
		}
	}
	if len(value.Pts) == 0 {
		return nil
	}
	return []svgchart.Series{value, base}
}

// WriteCharts writes the charts into dir.
func WriteCharts(dir string, files []*SectionFile) ([]ChartFile, error) {
	list, data := Charts(files)
	for _, c := range list {
		if err := os.WriteFile(filepath.Join(dir, c.Name), data[c.Name], 0o644); err != nil {
			return nil, err
		}
	}
	return list, nil
}
