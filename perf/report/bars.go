package report

// Target is one bar of the performance targets (docs/design.md
// "Performance targets"), made checkable: a result row names it by ID
// (Result.Bar).
type Target struct {
	ID      string
	What    string // what is measured, as the table row says
	Bar     string // the bar, as the table writes it
	Stretch string
	On      string  // "value" or "ratio"
	Op      string  // "<=", ">=" or "<"
	Limit   float64 // the bar, in the result's unit (On "value") or as a ratio
	// StretchLimit is the stretch goal on the same quantity; 0 when the
	// stretch is against another baseline (then it is its own Target).
	StretchLimit float64
	// StretchOnly: this target is the stretch goal of another row.
	StretchOnly bool
}

// Targets is the performance-targets table (docs/design.md "Performance
// targets": the reference design's table as since adjusted, plus the
// netstack bar of docs/netstack.md and the netperf bars of issue #15), in
// its order.
var Targets = []Target{
	{ID: "shm-velo-p50", What: "shm VELO 120 B ping-pong p50", Bar: "≤ 2 µs", Stretch: "≤ 1 µs", On: "value", Op: "<=", Limit: 2000, StretchLimit: 1000},
	{ID: "shm-rma-get", What: "shm RMA GET 64 KiB–8 MiB bandwidth", Bar: "≥ 0.5× memcpy of the same size", Stretch: "≥ 0.8×", On: "ratio", Op: ">=", Limit: 0.5, StretchLimit: 0.8},
	{ID: "iperf3-exn0", What: "iperf3 1 stream over exn0, 2 netns nodes, shm fabric", Bar: "≥ 0.5× veth TCP", Stretch: "≥ 1.0× veth", On: "ratio", Op: ">=", Limit: 0.5, StretchLimit: 1.0},
	{ID: "sockperf-p50-exn0", What: "sockperf TCP p50 over exn0", Bar: "≤ 3× veth", Stretch: "≤ 1.5× veth", On: "ratio", Op: "<=", Limit: 3, StretchLimit: 1.5},
	{ID: "extds-p50", What: "EXT-DS (library) p50 latency", Bar: "≤ 0.5× TCP over exn0", Stretch: "≤ veth", On: "ratio", Op: "<=", Limit: 0.5},
	{ID: "extds-p50-veth", What: "EXT-DS (library) p50 latency (stretch)", Bar: "≤ veth", On: "ratio", Op: "<=", Limit: 1, StretchOnly: true},
	{ID: "iperf3-shim", What: "iperf3 through libextds.so", Bar: "≥ 1.0× TCP over exn0", Stretch: "≥ 1.0× veth", On: "ratio", Op: ">=", Limit: 1},
	{ID: "iperf3-shim-veth", What: "iperf3 through libextds.so (stretch)", Bar: "≥ 1.0× veth", On: "ratio", Op: ">=", Limit: 1, StretchOnly: true},
	// Issue #15 (netperf, 2 netns nodes on shm): bar against TCP over
	// exn0, goal against veth (RR, STREAM) or TCP over exn0 (CRR).
	{ID: "netperf-rr-shim", What: "netperf TCP_RR through libextds.so (issue #15)", Bar: "≥ 3× TCP over exn0", Stretch: "≥ 1.5× veth", On: "ratio", Op: ">=", Limit: 3},
	{ID: "netperf-rr-shim-veth", What: "netperf TCP_RR through libextds.so (goal)", Bar: "≥ 1.5× veth", On: "ratio", Op: ">=", Limit: 1.5, StretchOnly: true},
	{ID: "netperf-crr-shim", What: "netperf TCP_CRR through libextds.so (issue #15)", Bar: "≥ 0.7× TCP over exn0", Stretch: "≥ 1.0× TCP over exn0", On: "ratio", Op: ">=", Limit: 0.7, StretchLimit: 1.0},
	{ID: "netperf-stream-shim", What: "netperf TCP_STREAM through libextds.so (issue #15)", Bar: "≥ 1.0× TCP over exn0", Stretch: "≥ 1.0× veth", On: "ratio", Op: ">=", Limit: 1},
	{ID: "netperf-stream-shim-veth", What: "netperf TCP_STREAM through libextds.so (goal)", Bar: "≥ 1.0× veth", On: "ratio", Op: ">=", Limit: 1, StretchOnly: true},
	// Issue #19 (wake-ups, 2 netns nodes on shm; docs/wakeup.md).
	{ID: "wake-ping-p50", What: "ping over exn0 p50 at 1, 5 and 50/s (issue #19)", Bar: "≤ 0.5 ms", Stretch: "", On: "value", Op: "<=", Limit: 0.5e6},
	{ID: "wake-ping-worst", What: "ping over exn0, worst of 20 at 5/s (issue #19)", Bar: "≤ 3 ms", On: "value", Op: "<=", Limit: 3e6},
	{ID: "wake-fping-cold", What: "exnctl ping cold p50 (issue #19)", Bar: "≤ 100 µs", On: "value", Op: "<=", Limit: 100e3},
	{ID: "wake-sockperf", What: "sockperf TCP ping-pong 64 B p50 over exn0 (issue #19)", Bar: "≤ 2× veth", Stretch: "≤ 1.2× veth", On: "ratio", Op: "<=", Limit: 2, StretchLimit: 1.2},
	{ID: "wake-idle", What: "idle exnd CPU share over 10 s (issue #19)", Bar: "< 0.5%", Stretch: "< 0.1%", On: "value", Op: "<", Limit: 0.5, StretchLimit: 0.1},
	{ID: "wake-idle-scale", What: "idle exnd among 32 nodes vs among 2 (issue #19)", Bar: "≤ 1× (no growth)", On: "ratio", Op: "<=", Limit: 1},
	{ID: "idle-cpu", What: "exnd idle CPU", Bar: "< 2% of a core", Stretch: "< 0.5%", On: "value", Op: "<", Limit: 2, StretchLimit: 0.5},
	{ID: "netstack-tcp", What: "node TCP over the engine vs a direct gVisor link (docs/netstack.md)", Bar: "≥ 0.7× direct", On: "ratio", Op: ">=", Limit: 0.7},
}

// TargetByID returns the target with this ID.
func TargetByID(id string) (Target, bool) {
	for _, t := range Targets {
		if t.ID == id {
			return t, true
		}
	}
	return Target{}, false
}

// Status of a result against a target.
type Status string

const (
	StatusNone    Status = ""
	StatusMiss    Status = "miss"
	StatusPass    Status = "pass"
	StatusStretch Status = "pass (stretch)"
)

func cmp(op string, x, limit float64) bool {
	switch op {
	case "<=":
		return x <= limit
	case ">=":
		return x >= limit
	case "<":
		return x < limit
	case ">":
		return x > limit
	}
	return false // an unknown operator never passes (Targets is checked by a test)
}

// Evaluate checks r against t. A ratio target with no baseline gives
// StatusNone.
func (t Target) Evaluate(r Result) Status {
	x := r.Value
	if t.On == "ratio" {
		if r.Baseline == 0 || r.Ratio == 0 {
			return StatusNone
		}
		x = r.Ratio
	}
	if !cmp(t.Op, x, t.Limit) {
		return StatusMiss
	}
	if t.StretchLimit != 0 && cmp(t.Op, x, t.StretchLimit) {
		return StatusStretch
	}
	return StatusPass
}

// Evaluate checks r against its Target (StatusNone without one).
func Evaluate(r Result) Status {
	t, ok := TargetByID(r.Bar)
	if !ok {
		return StatusNone
	}
	return t.Evaluate(r)
}
