package report

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/exn-project/exn/internal/bytesize"
	"github.com/exn-project/exn/perf/svgchart"
)

// Section is one part of the matrix: a go test invocation and how to turn
// its output into Results.
type Section struct {
	ID, Title string
	// About is a sentence for the document: what is measured against what.
	About string
	// Root: needs root, /dev/net/tun and Needs on PATH (network
	// namespaces); skipped with a note otherwise.
	Root  bool
	Needs []string
	// Args are the go test arguments (without -json and -count), Env the
	// extra environment, for this run's settings.
	Args func(p Params) []string
	Env  func(p Params) []string
	// Extract turns the parsed run into results; cmd is the reproduce
	// command to record in them.
	Extract func(st *Stream, cmd string) ([]Result, []string)
}

// Params are the run settings a section's command depends on.
type Params struct {
	Quick bool
	Count int
}

// Command is the shell command that reproduces s with p.
func (s Section) Command(p Params) string {
	var parts []string
	if s.Env != nil {
		parts = append(parts, s.Env(p)...)
	}
	parts = append(parts, "go", "test")
	for _, a := range s.Args(p) {
		parts = append(parts, shellQuote(a))
	}
	if p.Count > 0 {
		// -count goes before the package, after the flags.
		last := parts[len(parts)-1]
		parts = append(parts[:len(parts)-1], "-count", strconv.Itoa(p.Count), last)
	}
	return strings.Join(parts, " ")
}

// GoArgs are the arguments of the child go process.
func (s Section) GoArgs(p Params) []string {
	a := s.Args(p)
	pkg := a[len(a)-1]
	out := append([]string{"test"}, a[:len(a)-1]...)
	return append(out, "-count", strconv.Itoa(p.Count), "-json", pkg)
}

func shellQuote(s string) string {
	if s != "" && !strings.ContainsAny(s, " '\"$|()*?[]^&;<>\\`!{}") {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// benchArgs are the go test arguments that run the benchmarks matching
// bench in pkg for benchtime and no tests; extra flags go before pkg.
func benchArgs(bench, benchtime, pkg string, extra ...string) []string {
	a := append([]string{"-run", "^$", "-bench", bench, "-benchtime", benchtime}, extra...)
	return append(a, pkg)
}

// bench is the Args of a section that runs the benchmarks matching name
// in pkg (benchArgs) for benchtime quick under -quick, full otherwise.
func bench(name, quick, full, pkg string, extra ...string) func(Params) []string {
	return func(p Params) []string { return benchArgs(name, pick(p, quick, full), pkg, extra...) }
}

// secsEnv is the Env of a section whose runs last EXN_PERF_SECS seconds
// (2 under -quick, 4 otherwise), after the variables vars.
func secsEnv(vars ...string) func(Params) []string {
	return func(p Params) []string { return slices.Concat(vars, []string{"EXN_PERF_SECS=" + pick(p, "2", "4")}) }
}

func pick(p Params, quick, full string) string {
	if p.Quick {
		return quick
	}
	return full
}

// Sections is the matrix, in document order.
var Sections = []Section{
	fabricSection("mem", "in-process channels"),
	fabricSection("shm", "shared memory between NICs (here: one process, two NICs)"),
	fabricSection("net", "TCP over loopback"),
	{
		ID: "exteth-engine", Title: "EXT-Eth engine on mem, by frame size",
		About:   "Two engines on fabric/mem, batches of 32 frames from A to B's Link, against one memcpy of the same frame in the same run.",
		Args:    bench("^BenchmarkTransmit$", "2000x", "20000x", "./exn/"),
		Extract: extractEngine,
	},
	{
		ID: "netstack", Title: "EXT-Eth on netstack: node TCP vs a direct gVisor link",
		About:   "One TCP flow between two gVisor netstack nodes over the engine on fabric/mem, 32 MiB per iteration, against gVisor stacks joined directly (the strongest baseline: a zero-copy channel link), interleaved in one loop.",
		Args:    bench("^BenchmarkTCP", "4x", "20x", "./exn/node/", "-timeout", "30m"),
		Extract: extractNetstack,
	},
	{
		ID: "exteth-tap", Title: "EXT-Eth on TAP: exn0 between two namespaces vs veth",
		About: "Two network namespaces each running exnd on one shm fabric (exn0), against a veth pair between two other namespaces, in the same run: iperf3, sockperf TCP ping-pong (half round trip) and exnd's idle CPU.",
		Root:  true, Needs: []string{"ip", "iperf3", "sockperf"},
		Env:     secsEnv(),
		Args:    bench("^BenchmarkExtEth$", "1x", "1x", "./perf/", "-timeout", "30m"),
		Extract: extractExtEthTAP,
	},
	{
		ID: "extds", Title: "EXT-DS library vs TCP loopback",
		About:   "EXT-DS stream sockets as a Go library over fabric/mem, against kernel TCP over loopback in the same run: ping-pong (half round trip) by message size, one-way stream throughput by write size.",
		Args:    bench("^Benchmark(PingPong|Stream)$", "300x", "2000x", "./extds/"),
		Extract: extractEXTDS,
	},
	{
		ID: "shim", Title: "EXT-DS through the LD_PRELOAD shim vs TCP over exn0 vs veth",
		About: "Unmodified iperf3 and sockperf between two namespaces running exnd on one shm fabric: through libextds.so (EXT-DS), plain TCP over exn0, and TCP over a veth pair between the same namespaces.",
		Root:  true, Needs: []string{"ip", "ss", "iperf3", "sockperf", "gcc"},
		Env: secsEnv("EXN_PERF=1"),
		Args: func(p Params) []string {
			return []string{"-run", "^TestShimPerf$", "-v", "-timeout", "30m", "./integration/"}
		},
		Extract: extractShim,
	},
	netperfSection, // netperf.go
	wakeupSection,  // wakeup.go
}

// SectionByID returns the section with this ID.
func SectionByID(id string) (Section, bool) {
	for _, s := range Sections {
		if s.ID == id {
			return s, true
		}
	}
	return Section{}, false
}

func fabricSection(backend, what string) Section {
	return Section{
		ID: "fabric-" + backend, Title: "Raw fabric: " + backend,
		About:   fmt.Sprintf("fabrictest.Bench on the %s backend (%s): VELO 120 B one-way latency (half a ping-pong round trip) and message rate, RMA GET/PUT bandwidth by size against a memcpy of the same size measured in the same run.", backend, what),
		Args:    bench("^BenchmarkFabric$", "100ms", "500ms", "./fabric/"+backend+"/"),
		Extract: func(st *Stream, cmd string) ([]Result, []string) { return extractFabric(backend, st, cmd) },
	}
}

func samples(a *Agg) int { return a.Samples }

func extractFabric(backend string, st *Stream, cmd string) ([]Result, []string) {
	suite := "fabric-" + backend
	ag := Aggregate(st.Benches)
	var out []Result
	add := func(r Result, a *Agg, unit string) {
		r.Suite, r.Command, r.Samples = suite, cmd, samples(a)
		r.Spread = a.Spread[unit]
		out = append(out, r)
	}
	if a, ok := ag["Fabric/VELO/pingpong-120B"]; ok {
		bar := ""
		if backend == "shm" {
			bar = "shm-velo-p50"
		}
		add(Result{Name: "VELO ping-pong 120 B, one way", Metric: "p50", Value: a.Metrics["p50-ns"], Unit: "ns", Size: 120, Series: "VELO " + backend, Bar: bar}, a, "p50-ns")
		add(Result{Name: "VELO ping-pong 120 B, one way", Metric: "p99", Value: a.Metrics["p99-ns"], Unit: "ns", Size: 120, Series: "VELO " + backend}, a, "p99-ns")
	}
	if a, ok := ag["Fabric/VELO/send-recv-120B"]; ok {
		add(Result{Name: "VELO send+recv 120 B, one goroutine", Metric: "time", Value: a.Metrics["ns/op"], Unit: "ns", Size: 120}, a, "ns/op")
	}
	if a, ok := ag["Fabric/VELO/rate-120B"]; ok {
		add(Result{Name: "VELO message rate 120 B, batches of 64", Metric: "rate", Value: a.Metrics["msgs/s"], Unit: "msgs/s", Size: 120}, a, "msgs/s")
	}
	var rma []Result
	for name, a := range ag {
		rest, ok := strings.CutPrefix(name, "Fabric/RMA/")
		if !ok {
			continue
		}
		op, _, _ := strings.Cut(rest, "-")
		size := bytesize.Parse(rest)
		if size == 0 {
			continue
		}
		r := Result{Suite: suite, Command: cmd, Samples: a.Samples, Spread: a.Spread["MB/s"],
			Name: fmt.Sprintf("RMA %s %s", op, svgchart.SizeName(size)), Metric: "bandwidth", Value: a.Metrics["MB/s"], Unit: "MB/s",
			Size: size, Series: op, BaselineName: "memcpy"}
		if mc := a.Metrics["memcpy-ns"]; mc > 0 {
			r.Baseline = float64(size) / mc * 1e3
			r.Ratio = r.Value / r.Baseline
		}
		if backend == "shm" && op == "get" && size >= 64<<10 {
			r.Bar = "shm-rma-get"
		}
		rma = append(rma, r)
	}
	slices.SortFunc(rma, func(a, b Result) int {
		if a.Series != b.Series {
			return strings.Compare(a.Series, b.Series)
		}
		return a.Size - b.Size
	})
	return append(out, rma...), nil
}

func extractEngine(st *Stream, cmd string) ([]Result, []string) {
	ag := Aggregate(st.Benches)
	var out []Result
	for name, a := range ag {
		sz, ok := strings.CutPrefix(name, "Transmit/exn/")
		if !ok {
			continue
		}
		size, _ := strconv.Atoi(sz)
		r := Result{Suite: "exteth-engine", Command: cmd, Samples: a.Samples, Spread: a.Spread["MB/s"],
			Name: fmt.Sprintf("frame %d B", size), Metric: "throughput", Value: a.Metrics["MB/s"], Unit: "MB/s",
			Size: size, Series: "exn", BaselineName: "memcpy"}
		if m, ok := ag["Transmit/memcpy/"+sz]; ok && m.Metrics["MB/s"] > 0 {
			r.Baseline = m.Metrics["MB/s"]
			r.Ratio = r.Value / r.Baseline
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Result) int { return a.Size - b.Size })
	return out, nil
}

func extractNetstack(st *Stream, cmd string) ([]Result, []string) {
	ag := Aggregate(st.Benches)
	var out []Result
	var notes []string
	if a, ok := ag["TCPRatio"]; ok {
		// The baseline is gVisor's channel link, which copies each
		// packet once; the zero-copy link is the stricter one.
		for _, bl := range []struct{ key, name, ratio, bar string }{
			{"channel-MB/s", "direct channel link (one copy per packet)", "ratio-channel", "netstack-tcp"},
			{"zerocopy-MB/s", "direct zero-copy link", "ratio-zerocopy", ""},
		} {
			r := Result{Suite: "netstack", Command: cmd, Samples: a.Samples, Name: "TCP 1 flow, alternated with direct (medians per transfer)", Metric: "throughput",
				Value: a.Metrics["fabric-MB/s"], Unit: "MB/s", Baseline: a.Metrics[bl.key], BaselineName: bl.name, Bar: bl.bar, Spread: a.Spread[bl.ratio]}
			if r.Baseline > 0 {
				r.Ratio = r.Value / r.Baseline
			}
			out = append(out, r)
		}
		notes = append(notes, fmt.Sprintf("BenchmarkTCPRatio retransmits (median per run): fabric %.0f, channel %.0f.", a.Metrics["fabric-retrans"], a.Metrics["channel-retrans"]))
	}
	base := ag["TCP/direct-channel"]
	for _, v := range []string{"fabric", "fabric-csum-offload", "wire", "direct-pipe", "direct-channel-copy"} {
		a, ok := ag["TCP/"+v]
		if !ok {
			continue
		}
		r := Result{Suite: "netstack", Command: cmd, Samples: a.Samples, Spread: a.Spread["MB/s-flow"], Name: "TCP 1 flow, " + v, Metric: "throughput", Value: a.Metrics["MB/s-flow"], Unit: "MB/s", BaselineName: "direct-channel"}
		if base != nil && base.Metrics["MB/s-flow"] > 0 {
			r.Baseline = base.Metrics["MB/s-flow"]
			r.Ratio = r.Value / r.Baseline
		}
		out = append(out, r)
		if a.Metrics["rto"] > 0 {
			notes = append(notes, fmt.Sprintf("%s: %.0f RTOs (a 200 ms gVisor RTO dominates a ~10 ms transfer; BenchmarkTCP is a mean, the ratio row uses medians).", v, a.Metrics["rto"]))
		}
	}
	return out, notes
}

func extractExtEthTAP(st *Stream, cmd string) ([]Result, []string) {
	ag := Aggregate(st.Benches)
	a, ok := ag["ExtEth"]
	if !ok {
		return nil, nil
	}
	m := a.Metrics
	var out []Result
	add := func(r Result, unit string) {
		r.Suite, r.Command, r.Samples, r.BaselineName = "exteth-tap", cmd, a.Samples, "veth"
		r.Spread = a.Spread[unit]
		if r.Baseline > 0 {
			r.Ratio = r.Value / r.Baseline
		}
		out = append(out, r)
	}
	for _, s := range []struct{ key, name, bar string }{{"iperf3-TCP-1-streams", "iperf3 TCP, 1 stream", "iperf3-exn0"}, {"iperf3-TCP-2-streams", "iperf3 TCP, 2 streams", ""}} {
		if v, ok := m[s.key+"-exn-Gbit/s"]; ok {
			add(Result{Name: s.name, Metric: "throughput", Value: v, Unit: "Gbit/s", Baseline: m[s.key+"-veth-Gbit/s"], Bar: s.bar}, s.key+"-exn-Gbit/s")
		}
	}
	for _, p := range []string{"p50", "p99"} {
		key := "sockperf-TCP-ping-pong-" + p
		if v, ok := m[key+"-exn-us"]; ok {
			bar := ""
			if p == "p50" {
				bar = "sockperf-p50-exn0"
			}
			add(Result{Name: "sockperf TCP ping-pong, one way", Metric: p, Value: v * 1e3, Unit: "ns", Baseline: m[key+"-veth-us"] * 1e3, Bar: bar, Series: "TCP over exn0"}, key+"-exn-us")
		}
	}
	if v, ok := m["idle-cpu-%"]; ok {
		r := Result{Suite: "exteth-tap", Command: cmd, Samples: a.Samples, Name: "exnd idle CPU (max of 2 nodes, 5 s)", Metric: "cpu", Value: v, Unit: "%", Bar: "idle-cpu", Spread: a.Spread["idle-cpu-%"]}
		out = append(out, r)
	}
	return out, nil
}

func extractEXTDS(st *Stream, cmd string) ([]Result, []string) {
	ag := Aggregate(st.Benches)
	var out []Result
	for name, a := range ag {
		kind, rest, ok := strings.Cut(name, "/extds/")
		if !ok {
			continue
		}
		size := bytesize.Parse(rest)
		tcp := ag[kind+"/tcp/"+rest]
		switch kind {
		case "PingPong":
			for _, p := range []string{"p50", "p99"} {
				unit := p + "-µs"
				r := Result{Suite: "extds", Command: cmd, Samples: a.Samples, Spread: a.Spread[unit], Name: fmt.Sprintf("ping-pong %s, one way", svgchart.SizeName(size)), Metric: p,
					Value: a.Metrics[unit] * 1e3, Unit: "ns", Size: size, Series: "pingpong", BaselineName: "TCP loopback"}
				if tcp != nil && tcp.Metrics[unit] > 0 {
					r.Baseline = tcp.Metrics[unit] * 1e3
					r.Ratio = r.Value / r.Baseline
				}
				out = append(out, r)
			}
		case "Stream":
			r := Result{Suite: "extds", Command: cmd, Samples: a.Samples, Spread: a.Spread["MB/s"], Name: fmt.Sprintf("stream, %s writes", svgchart.SizeName(size)), Metric: "throughput",
				Value: a.Metrics["MB/s"], Unit: "MB/s", Size: size, Series: "stream", BaselineName: "TCP loopback"}
			if tcp != nil && tcp.Metrics["MB/s"] > 0 {
				r.Baseline = tcp.Metrics["MB/s"]
				r.Ratio = r.Value / r.Baseline
			}
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Result) int {
		if a.Series != b.Series {
			return strings.Compare(a.Series, b.Series)
		}
		if a.Size != b.Size {
			return a.Size - b.Size
		}
		return strings.Compare(a.Metric, b.Metric)
	})
	return out, nil
}

// shimRow matches a row of TestShimPerf's table:
//
//	| iperf3, 1 stream | 3.10 Gbit/s | 2.50 Gbit/s | 9.80 Gbit/s | 1.24x |
var shimRow = regexp.MustCompile(`^\s*\|\s*((?:iperf3|sockperf)[^|]*?)\s*\|\s*([0-9.eE+-]+|NaN|\+Inf)\s*(\S+)\s*\|\s*([0-9.eE+-]+|NaN|\+Inf)\s*\S+\s*\|\s*([0-9.eE+-]+|NaN|\+Inf)\s*\S+\s*\|`)

// ShimRows collects the three-way rows (shim, exn0, veth) of every
// TestShimPerf table in the output: name -> unit and one [3] per run.
func ShimRows(lines []string) (order []string, units map[string]string, runs map[string][][3]float64) {
	units, runs = map[string]string{}, map[string][][3]float64{}
	for _, l := range lines {
		m := shimRow.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var v [3]float64
		for i, s := range []string{m[2], m[4], m[5]} {
			v[i], _ = strconv.ParseFloat(s, 64)
		}
		if _, ok := runs[m[1]]; !ok {
			order = append(order, m[1])
		}
		units[m[1]] = m[3]
		runs[m[1]] = append(runs[m[1]], v)
	}
	return order, units, runs
}

func extractShim(st *Stream, cmd string) ([]Result, []string) {
	order, units, runs := ShimRows(st.Lines)
	var out []Result
	for _, name := range order {
		var med [3]float64
		for i := range med {
			var vs []float64
			for _, r := range runs[name] {
				vs = append(vs, r[i])
			}
			med[i] = Median(vs)
		}
		unit, scale := units[name], 1.0
		if unit == "us" {
			unit, scale = "ns", 1e3
		}
		metric, rname := "throughput", name
		if i := strings.LastIndex(name, " p"); i > 0 && strings.HasPrefix(name, "sockperf") {
			metric, rname = name[i+1:], name[:i]+", one way"
		}
		mk := func(val, base float64, bname, bar, series string) Result {
			r := Result{Suite: "shim", Command: cmd, Samples: len(runs[name]), Name: rname, Metric: metric, Value: val * scale, Unit: unit,
				Baseline: base * scale, BaselineName: bname, Bar: bar, Series: series}
			if base > 0 && !math.IsNaN(base) {
				r.Ratio = val / base
			}
			return r
		}
		shimBar, vethBar := "", ""
		if name == "iperf3, 1 stream" {
			shimBar, vethBar = "iperf3-shim", "iperf3-shim-veth"
		}
		out = append(out,
			mk(med[0], med[1], "TCP over exn0", shimBar, "EXT-DS shim"),
			mk(med[0], med[2], "veth", vethBar, ""),
		)
	}
	var notes []string
	for _, s := range st.Skips {
		notes = append(notes, "skipped: "+s)
	}
	return out, notes
}
