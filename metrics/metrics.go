package metrics

import (
	"net/http"
	"sort"
	"strconv"

	"github.com/exn-project/exn/fabric"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every exn metric.
const Namespace = "exn"

// NewRegistry returns a private registry with the Go and process
// collectors and the given exn collectors. It fails if two collectors
// describe the same metric.
func NewRegistry(cs ...prometheus.Collector) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	all := append([]prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}, cs...)
	for _, c := range all {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// Handler serves reg in the Prometheus exposition format. Errors while
// gathering are reported in the response, not by panicking.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, Registry: reg})
}

// family is one metric family: a descriptor plus how to read its samples
// from a snapshot of type S.
type family[S any] struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	// samples emits one value per label combination.
	samples func(s *S, emit func(v float64, labels ...string))
}

// snapshotCollector reads a snapshot once per scrape and emits every
// family from it. It is the one generic piece each layer's collector is
// built from.
type snapshotCollector[S any] struct {
	read     func() S
	families []family[S]
}

func (c *snapshotCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range c.families {
		ch <- f.desc
	}
}

func (c *snapshotCollector[S]) Collect(ch chan<- prometheus.Metric) {
	s := c.read()
	for _, f := range c.families {
		f.samples(&s, func(v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(f.desc, f.typ, v, labels...)
		})
	}
}

// builder accumulates families for one subsystem with shared constant
// labels.
type builder[S any] struct {
	subsystem string
	constant  prometheus.Labels
	families  []family[S]
}

// nodeBuilder starts the collector of one layer on one node: subsystem,
// the "node" label and any further constant label pairs (name, value).
func nodeBuilder[S any](subsystem string, node fabric.NodeID, labelPairs ...string) *builder[S] {
	l := prometheus.Labels{"node": strconv.Itoa(int(node))}
	for i := 0; i+1 < len(labelPairs); i += 2 {
		l[labelPairs[i]] = labelPairs[i+1]
	}
	return &builder[S]{subsystem: subsystem, constant: l}
}

func (b *builder[S]) add(name, help string, typ prometheus.ValueType, labelNames []string, samples func(s *S, emit func(v float64, labels ...string))) {
	b.families = append(b.families, family[S]{
		desc:    prometheus.NewDesc(prometheus.BuildFQName(Namespace, b.subsystem, name), help, labelNames, b.constant),
		typ:     typ,
		samples: samples,
	})
}

// counter adds an unlabelled counter.
func (b *builder[S]) counter(name, help string, v func(s *S) uint64) {
	b.add(name, help, prometheus.CounterValue, nil, func(s *S, emit func(float64, ...string)) { emit(float64(v(s))) })
}

// gauge adds an unlabelled gauge.
func (b *builder[S]) gauge(name, help string, v func(s *S) float64) {
	b.add(name, help, prometheus.GaugeValue, nil, func(s *S, emit func(float64, ...string)) { emit(v(s)) })
}

// labelled is one label value and how to read its sample.
type labelled[S any, V uint64 | float64] struct {
	value string
	read  func(s *S) V
}

// counterVec adds a counter with one label whose values are fixed.
func (b *builder[S]) counterVec(name, help, label string, vals []labelled[S, uint64]) {
	addVec(b, name, help, label, prometheus.CounterValue, vals)
}

// gaugeVec adds a gauge with one label whose values are fixed.
func (b *builder[S]) gaugeVec(name, help, label string, vals []labelled[S, float64]) {
	addVec(b, name, help, label, prometheus.GaugeValue, vals)
}

// The values of the label "direction", in the order a counterDir reads
// them.
var (
	txRx  = [2]string{"tx", "rx"}
	rxTx  = [2]string{"rx", "tx"}
	inOut = [2]string{"in", "out"}
)

// counterDir adds a counter with the label "direction" whose two values,
// dirs, are read by first and second.
func (b *builder[S]) counterDir(name, help string, dirs [2]string, first, second func(s *S) uint64) {
	b.counterVec(name, help, "direction", []labelled[S, uint64]{{dirs[0], first}, {dirs[1], second}})
}

func addVec[S any, V uint64 | float64](b *builder[S], name, help, label string, typ prometheus.ValueType, vals []labelled[S, V]) {
	b.add(name, help, typ, []string{label}, func(s *S, emit func(float64, ...string)) {
		for _, lv := range vals {
			emit(float64(lv.read(s)), lv.value)
		}
	})
}

func (b *builder[S]) collector(read func() S) prometheus.Collector {
	return &snapshotCollector[S]{read: read, families: b.families}
}

// counterMap adds a counter with one label whose values are the keys of
// a map in the snapshot, emitted in sorted order so scrapes are stable.
func (b *builder[S]) counterMap(name, help, label string, m func(s *S) map[string]uint64) {
	b.add(name, help, prometheus.CounterValue, []string{label}, func(s *S, emit func(float64, ...string)) {
		mm := m(s)
		keys := make([]string, 0, len(mm))
		for k := range mm {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			emit(float64(mm[k]), k)
		}
	})
}

// counterGrid adds a counter with two labels, reading one value per
// (first, second) pair: v is called with the indexes into firsts and
// seconds.
func (b *builder[S]) counterGrid(name, help string, labels [2]string, firsts, seconds []string, v func(s *S, i, j int) uint64) {
	b.add(name, help, prometheus.CounterValue, labels[:], func(s *S, emit func(float64, ...string)) {
		for i, f := range firsts {
			for j, sec := range seconds {
				emit(float64(v(s, i, j)), f, sec)
			}
		}
	})
}
