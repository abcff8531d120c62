package demo

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Dist is the distribution of one figure across the measured pairs.
type Dist struct {
	N      int     `json:"n"`
	Min    float64 `json:"min"`
	P10    float64 `json:"p10"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Max    float64 `json:"max"`
}

// Percentile returns the p-th percentile (0 <= p <= 100) of sorted, an
// ascending slice, interpolating linearly between the closest ranks
// (rank p/100*(n-1), 0-based: the median of an even count is the mean of
// the middle two). It returns NaN for an empty slice or p out of range.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 || !(p >= 0 && p <= 100) {
		return math.NaN()
	}
	r := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(r))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (r-float64(lo))*(sorted[hi]-sorted[lo])
}

// Distribution summarises xs (left unchanged), skipping NaNs; with no
// values it is the zero Dist.
func Distribution(xs []float64) Dist {
	s := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return Dist{}
	}
	slices.Sort(s)
	return Dist{N: len(s), Min: s[0], P10: Percentile(s, 10), Median: Percentile(s, 50), P90: Percentile(s, 90), Max: s[len(s)-1]}
}

// Summary is the distribution across pairs of each headline figure. The
// EXT-DS ones are nil when the run did not measure EXT-DS.
type Summary struct {
	TCPMBps  Dist  `json:"tcp_throughput_mb_s"`
	TCPP50us Dist  `json:"tcp_rtt_p50_us"`
	DSMBps   *Dist `json:"extds_throughput_mb_s,omitempty"`
	DSP50us  *Dist `json:"extds_rtt_p50_us,omitempty"`
	// RTTRatio is the per-pair EXT-DS rtt p50 over the TCP rtt p50.
	RTTRatio *Dist `json:"extds_tcp_rtt_p50_ratio,omitempty"`
}

// Summarize computes the Summary of pairs.
func Summarize(pairs []Pair) Summary {
	var tp, p50, dtp, d50, ratio []float64
	for _, p := range pairs {
		tp = append(tp, p.MBps)
		p50 = append(p50, p.P50us)
		if p.DS != nil {
			dtp = append(dtp, p.DS.MBps)
			d50 = append(d50, p.DS.P50us)
			if p.P50us > 0 {
				ratio = append(ratio, p.DS.P50us/p.P50us)
			}
		}
	}
	s := Summary{TCPMBps: Distribution(tp), TCPP50us: Distribution(p50)}
	if len(dtp) > 0 {
		a, b, c := Distribution(dtp), Distribution(d50), Distribution(ratio)
		s.DSMBps, s.DSP50us, s.RTTRatio = &a, &b, &c
	}
	return s
}

// LoadAvg is the system load average over 1, 5 and 15 minutes.
type LoadAvg struct {
	One     float64 `json:"1m"`
	Five    float64 `json:"5m"`
	Fifteen float64 `json:"15m"`
}

func (l LoadAvg) String() string { return fmt.Sprintf("%.2f %.2f %.2f", l.One, l.Five, l.Fifteen) }

// Machine is what else ran, as far as the run can tell: the CPUs and the
// load average before and after the measurements.
type Machine struct {
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	GoVersion  string `json:"go_version"`
	// LoadStart and LoadEnd are nil where /proc/loadavg cannot be read
	// (LoadErr says why).
	LoadStart *LoadAvg `json:"loadavg_start"`
	LoadEnd   *LoadAvg `json:"loadavg_end"`
	LoadErr   string   `json:"loadavg_error,omitempty"`
}

// loadavgPath is where Linux publishes the load average.
const loadavgPath = "/proc/loadavg"

// machineNow fills everything but LoadEnd.
func machineNow() Machine {
	m := Machine{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, GoVersion: runtime.Version()}
	m.LoadStart = m.readLoad()
	return m
}

// readLoad reads the load average, recording a failure in m.LoadErr.
func (m *Machine) readLoad() *LoadAvg {
	l, err := readLoadavg(loadavgPath)
	if err != nil {
		m.LoadErr = err.Error()
		return nil
	}
	return &l
}

func readLoadavg(path string) (LoadAvg, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return LoadAvg{}, fmt.Errorf("demo: load average: %w", err)
	}
	return parseLoadavg(string(b))
}

// parseLoadavg parses the first three fields of /proc/loadavg
// ("0.41 0.83 1.17 1/82 21529").
func parseLoadavg(s string) (LoadAvg, error) {
	f := strings.Fields(s)
	if len(f) < 3 {
		return LoadAvg{}, fmt.Errorf("demo: load average %q: want three numbers", s)
	}
	var v [3]float64
	for i := range v {
		x, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return LoadAvg{}, fmt.Errorf("demo: load average %q: field %d: %w", s, i+1, err)
		}
		if x < 0 || math.IsInf(x, 0) || math.IsNaN(x) {
			return LoadAvg{}, fmt.Errorf("demo: load average %q: field %d: not a load", s, i+1)
		}
		v[i] = x
	}
	return LoadAvg{v[0], v[1], v[2]}, nil
}
