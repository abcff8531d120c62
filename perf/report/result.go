package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Result is one measured number, with the baseline measured in the same
// run when there is one. Ratio is Value / Baseline (0 without a
// baseline): for throughput higher is better, for latency lower is.
type Result struct {
	Suite    string  `json:"suite"`  // section ID, e.g. "fabric-shm"
	Name     string  `json:"name"`   // row, e.g. "RMA get 64 KiB"
	Metric   string  `json:"metric"` // "p50", "p99", "bandwidth", "rate", ...
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"` // "ns", "MB/s" (1e6 B/s), "Gbit/s", "msgs/s", "%"
	Baseline float64 `json:"baseline,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Command  string  `json:"command"`

	// Optional fields.
	BaselineName string  `json:"baseline_name,omitempty"` // "memcpy", "veth", "TCP loopback"
	Size         int     `json:"size,omitempty"`          // message/frame/write size in bytes, for charts
	Series       string  `json:"series,omitempty"`        // chart series, e.g. "get", "extds"
	Bar          string  `json:"bar,omitempty"`           // Target ID (Targets, bars.go)
	Samples      int     `json:"samples,omitempty"`       // runs the median is taken over
	Spread       float64 `json:"spread,omitempty"`        // (max-min)/median over the samples
}

// SectionFile is what one section saves: its results, or why it was
// skipped.
type SectionFile struct {
	Section string    `json:"section"`
	Title   string    `json:"title"`
	Command string    `json:"command"` // reproduces the whole section
	Count   int       `json:"count"`
	Time    time.Time `json:"time"`
	Machine string    `json:"machine,omitempty"`
	Skipped string    `json:"skipped,omitempty"`
	Notes   []string  `json:"notes,omitempty"`
	Results []Result  `json:"results"`
}

// Save writes s to dir/<section>.json.
func (s *SectionFile) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, s.Section+".json"), append(b, '\n'), 0o644)
}

// LoadDir reads every *.json section file in dir, keyed by section ID. A
// missing dir is no error.
func LoadDir(dir string) (map[string]*SectionFile, error) {
	out := map[string]*SectionFile{}
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		var s SectionFile
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		if s.Section == "" {
			s.Section = strings.TrimSuffix(filepath.Base(n), ".json")
		}
		out[s.Section] = &s
	}
	return out, nil
}

// find returns the first result of suite with this name and metric.
func find(all []Result, suite, name, metric string) (Result, bool) {
	for _, r := range all {
		if r.Suite == suite && r.Name == name && r.Metric == metric {
			return r, true
		}
	}
	return Result{}, false
}
