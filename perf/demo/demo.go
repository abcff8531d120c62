package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/exn/node"
	"github.com/exn-project/exn/extds"
)

// Options configures Run.
type Options struct {
	Nodes      int           // cluster size, >= 2
	Duration   time.Duration // throughput test length per pair (before Budget)
	MaxBytes   int64         // throughput test cap per pair (0: none)
	RoundTrips int           // ping-pong round trips per pair (before Budget)
	MTU        int           // IP MTU (0: default 65521)
	NoEXTDS    bool          // skip the EXT-DS measurements
	// Sampling chooses the pairs (the zero value: all pairs up to 8
	// nodes, the ring and 2 random peers per node beyond).
	Sampling Sampling
	// Budget, if positive, is the time the measurements should take:
	// when the pairs at Duration and RoundTrips are estimated to take
	// longer, both are scaled down to fit (see PlanTests).
	Budget time.Duration
	// Progress, if set, receives a one-line status after each step.
	Progress func(done, total int, what string)
	Logger   *slog.Logger
}

// Pair is the result of one ordered pair.
type Pair struct {
	From       string  `json:"from"`
	To         string  `json:"to"`
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	MBps       float64 `json:"throughput_mb_s"` // 10^6 bytes per second
	Gbps       float64 `json:"throughput_gbit_s"`
	RoundTrips int     `json:"round_trips"`
	P50us      float64 `json:"rtt_p50_us"`
	P99us      float64 `json:"rtt_p99_us"`
	Minus      float64 `json:"rtt_min_us"`
	// DS is the same pair over EXT-DS (nil with Options.NoEXTDS).
	DS *PathResult `json:"extds,omitempty"`
}

// PathResult is one path's measurements of a pair.
type PathResult struct {
	Bytes      int64   `json:"bytes"`
	Seconds    float64 `json:"seconds"`
	MBps       float64 `json:"throughput_mb_s"`
	Gbps       float64 `json:"throughput_gbit_s"`
	RoundTrips int     `json:"round_trips"`
	P50us      float64 `json:"rtt_p50_us"`
	P99us      float64 `json:"rtt_p99_us"`
	Minus      float64 `json:"rtt_min_us"`
}

// Result is a whole run.
type Result struct {
	Started    time.Time    `json:"started"`
	Nodes      int          `json:"nodes"`
	Fabric     string       `json:"fabric"`
	Transport  string       `json:"transport"`
	MTU        int          `json:"mtu"`
	TCP        string       `json:"tcp"`
	DurationS  float64      `json:"per_pair_seconds"`
	RoundTrips int          `json:"round_trips_per_pair"`
	Sampling   SamplingInfo `json:"sampling"`
	Machine    Machine      `json:"machine"`
	Summary    Summary      `json:"summary"`
	Pairs      []Pair       `json:"pairs"`
	EngineRx   uint64       `json:"engine_rendezvous_frames"`
	EngineDrop uint64       `json:"engine_drops"`
	StartupS   float64      `json:"startup_seconds"` // cluster, servers and EXT-DS devices up
	WallS      float64      `json:"wall_seconds"`
}

// SamplingInfo says which pairs a run measured, of how many, and how
// long each test was.
type SamplingInfo struct {
	Rule      string `json:"rule"` // "all" or "ring+random"
	Measured  int    `json:"pairs_measured"`
	Total     int    `json:"pairs_total"` // n(n-1) ordered pairs
	Senders   int    `json:"senders"`     // distinct nodes among the senders
	Receivers int    `json:"receivers"`   // and the receivers
	AllUpTo   int    `json:"all_pairs_up_to_nodes"`
	Peers     int    `json:"random_peers_per_node"` // 0 with rule "all"
	Seed      uint64 `json:"seed"`
	// BudgetS is Options.Budget (0: none); Scale the factor it applied
	// to the requested test sizes, EstimateS the cost model's estimate.
	BudgetS             float64 `json:"budget_seconds"`
	Scale               float64 `json:"scale"`
	EstimateS           float64 `json:"estimate_seconds"`
	RequestedS          float64 `json:"requested_per_pair_seconds"`
	RequestedRoundTrips int     `json:"requested_round_trips"`
}

// Ports of the servers every node runs: TCP over EXT-Eth, and EXT-DS.
const (
	port   = 5201
	dsPort = 5202
)

// dialFunc dials a test connection on one path.
type dialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Run brings the cluster up, measures the sampled pairs (see Sampling) in
// turn, one test at a time, and shuts the cluster down. It stops early
// with ctx.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Nodes < 2 {
		return nil, fmt.Errorf("demo: %d nodes: need at least 2", o.Nodes)
	}
	if o.Duration <= 0 || o.RoundTrips <= 0 {
		return nil, errors.New("demo: duration and round trips must be positive")
	}
	if o.Budget < 0 {
		return nil, fmt.Errorf("demo: budget %v: must not be negative", o.Budget)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	edges, all, err := SamplePairs(o.Nodes, o.Sampling)
	if err != nil {
		return nil, err
	}
	paths := 2
	if o.NoEXTDS {
		paths = 1
	}
	plan, err := PlanTests(len(edges), paths, o.Duration, o.RoundTrips, o.Budget)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	machine := machineNow()
	c, err := node.NewCluster(o.Nodes, node.WithConfig(func(cfg *node.Config) {
		cfg.Logger = o.Logger
		cfg.MTU = o.MTU
	}))
	if err != nil {
		return nil, fmt.Errorf("demo: cluster: %w", err)
	}
	defer c.Close()
	nodes := c.Nodes()
	t := nodes[0].TCP()
	res := &Result{
		Started: start.UTC(), Nodes: o.Nodes, Fabric: "mem (in-process)",
		Transport: transport(o), MTU: nodes[0].MTU(),
		TCP: fmt.Sprintf("%s, SACK %v, send buffer %d/%d/%d, receive buffer %d/%d/%d", t.CongestionControl, !t.DisableSACK,
			t.SendBuffer.Min, t.SendBuffer.Default, t.SendBuffer.Max, t.ReceiveBuffer.Min, t.ReceiveBuffer.Default, t.ReceiveBuffer.Max),
		DurationS: plan.Duration.Seconds(), RoundTrips: plan.RoundTrips,
		Sampling: samplingInfo(o, edges, all, plan),
		Machine:  machine,
	}

	// Every node serves a sink (throughput) and an echo (ping-pong) on
	// each path: two listeners per node, whatever the pairs.
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, n := range nodes {
		l, err := n.Listen("tcp4", fmt.Sprintf(":%d", port))
		if err != nil {
			return nil, fmt.Errorf("demo: listen: %w", err)
		}
		defer l.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve(l)
		}()
	}

	// EXT-DS: a Device per node on its NIC, the listener's shadow TCP on
	// the node's netstack, peers resolved from the cluster's addresses
	// (one resolver, shared).
	dsDial := map[*node.Node]dialFunc{}
	if !o.NoEXTDS {
		res := extds.StaticResolver{}
		for _, n := range nodes {
			res[n.Addr().Addr()] = n.NIC().Node()
		}
		for _, n := range nodes {
			dev, err := extds.NewDevice(n.NIC(), extds.WithResolver(res), extds.WithLogger(o.Logger))
			if err != nil {
				return nil, fmt.Errorf("demo: extds device: %w", err)
			}
			defer dev.Close()
			inner, err := n.Listen("tcp4", fmt.Sprintf(":%d", dsPort))
			if err != nil {
				return nil, fmt.Errorf("demo: listen: %w", err)
			}
			l := extds.NewListener(dev, inner)
			defer l.Close()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(l)
			}()
			d := &extds.Dialer{Device: dev, DialContext: n.DialContext}
			dsDial[n] = func(ctx context.Context, network, address string) (net.Conn, error) {
				c, err := d.DialConn(ctx, network, address)
				if err != nil {
					return nil, err
				}
				if c.Mode() != extds.ModeEXTDS {
					c.Close()
					return nil, fmt.Errorf("extds connection fell back to %v", c.Mode())
				}
				return c, nil
			}
		}
	}
	res.StartupS = time.Since(start).Seconds()

	total := len(edges)
	for done, e := range edges {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		a, b := nodes[e.From], nodes[e.To]
		p, err := measurePair(ctx, o, plan, done, total, a, b, dsDial[a])
		if err != nil {
			return nil, err
		}
		res.Pairs = append(res.Pairs, p)
	}
	if o.Progress != nil {
		o.Progress(total, total, "done")
	}
	res.Machine.LoadEnd = res.Machine.readLoad()
	for _, n := range nodes {
		st := n.Engine().Stats()
		res.EngineRx += st.RxFrames[exn.ProtoRendezvous]
		res.EngineDrop += st.TotalDrops()
	}
	res.Summary = Summarize(res.Pairs)
	res.WallS = time.Since(start).Seconds()
	return res, nil
}

// measurePair runs the throughput and latency tests of a -> b, over TCP
// and, with dsDial, over EXT-DS.
func measurePair(ctx context.Context, o Options, plan Plan, done, total int, a, b *node.Node, dsDial dialFunc) (Pair, error) {
	p := Pair{From: a.Addr().Addr().String(), To: b.Addr().Addr().String()}
	step := func(what string) {
		if o.Progress != nil {
			o.Progress(done, total, fmt.Sprintf("%s -> %s %s", p.From, p.To, what))
		}
	}
	step("throughput")
	dst := netip.AddrPortFrom(b.Addr().Addr(), port).String()
	var tcp PathResult
	if err := throughput(ctx, a.DialContext, dst, plan.Duration, o.MaxBytes, &tcp); err != nil {
		return p, fmt.Errorf("%s -> %s throughput: %w", p.From, p.To, err)
	}
	step("latency")
	if err := pingPong(ctx, a.DialContext, dst, plan.RoundTrips, &tcp); err != nil {
		return p, fmt.Errorf("%s -> %s latency: %w", p.From, p.To, err)
	}
	p.Bytes, p.Seconds, p.MBps, p.Gbps = tcp.Bytes, tcp.Seconds, tcp.MBps, tcp.Gbps
	p.RoundTrips, p.P50us, p.P99us, p.Minus = tcp.RoundTrips, tcp.P50us, tcp.P99us, tcp.Minus
	if dsDial == nil {
		return p, nil
	}
	dsDst := netip.AddrPortFrom(b.Addr().Addr(), dsPort).String()
	p.DS = &PathResult{}
	step("EXT-DS")
	if err := throughput(ctx, dsDial, dsDst, plan.Duration, o.MaxBytes, p.DS); err != nil {
		return p, fmt.Errorf("%s -> %s EXT-DS throughput: %w", p.From, p.To, err)
	}
	if err := pingPong(ctx, dsDial, dsDst, plan.RoundTrips, p.DS); err != nil {
		return p, fmt.Errorf("%s -> %s EXT-DS latency: %w", p.From, p.To, err)
	}
	return p, nil
}

// samplingInfo describes the run's pairs and plan.
func samplingInfo(o Options, edges []Edge, all bool, plan Plan) SamplingInfo {
	s := o.Sampling.withDefaults()
	info := SamplingInfo{
		Rule: "all", Measured: len(edges), Total: o.Nodes * (o.Nodes - 1),
		AllUpTo: s.AllUpTo, Seed: s.Seed,
		BudgetS: o.Budget.Seconds(), Scale: plan.Scale, EstimateS: plan.Estimate.Seconds(),
		RequestedS: o.Duration.Seconds(), RequestedRoundTrips: o.RoundTrips,
	}
	if !all {
		info.Rule, info.Peers = "ring+random", s.Peers
	}
	from, to := map[int]bool{}, map[int]bool{}
	for _, e := range edges {
		from[e.From], to[e.To] = true, true
	}
	info.Senders, info.Receivers = len(from), len(to)
	return info
}

func transport(o Options) string {
	if o.NoEXTDS {
		return "TCP over EXT-Eth on gVisor netstack"
	}
	return "TCP over EXT-Eth on gVisor netstack, and EXT-DS"
}

// Test selector: the first byte of a connection.
const (
	modeSink = 's'
	modeEcho = 'e'
)

// serve accepts until l closes; each conn is a sink or an echo.
func serve(l net.Listener) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			var mode [1]byte
			if _, err := io.ReadFull(c, mode[:]); err != nil {
				return
			}
			switch mode[0] {
			case modeSink:
				n, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, make([]byte, 256<<10))
				var ack [8]byte
				putUint64(ack[:], uint64(n))
				c.Write(ack[:])
			case modeEcho:
				// Each byte back as it comes (pingPong's round trips); the
				// wrappers keep CopyBuffer on its buffer (no ReadFrom).
				io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 1))
			}
		}()
	}
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * (7 - i)))
	}
}

func getUint64(b []byte) uint64 {
	var v uint64
	for i := range 8 {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// openTest dials dst for one measurement and sends its mode byte; the end
// of ctx unblocks the connection. done stops that and closes it.
func openTest(ctx context.Context, dial dialFunc, dst string, mode byte) (c net.Conn, done func(), err error) {
	c, err = dial(ctx, "tcp4", dst)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	done = func() {
		stop()
		c.Close()
	}
	if _, err := c.Write([]byte{mode}); err != nil {
		done()
		return nil, nil, err
	}
	return c, done, nil
}

// throughput writes for d (or max bytes), then half-closes and waits for
// the sink's byte count, so the time covers delivery, not just queuing.
func throughput(ctx context.Context, dial dialFunc, dst string, d time.Duration, max int64, p *PathResult) error {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	c, done, err := openTest(ctx, dial, dst, modeSink)
	if err != nil {
		return err
	}
	defer done()
	buf := make([]byte, 256<<10)
	start := time.Now()
	end := start.Add(d)
	var sent int64
	for time.Now().Before(end) && (max == 0 || sent < max) {
		m, err := c.Write(buf)
		sent += int64(m)
		if err != nil {
			return err
		}
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return fmt.Errorf("sink count: %w", err)
	}
	el := time.Since(start)
	if got := int64(getUint64(ack[:])); got != sent {
		return fmt.Errorf("sink got %d bytes, sent %d", got, sent)
	}
	p.Bytes, p.Seconds = sent, el.Seconds()
	p.MBps = float64(sent) / el.Seconds() / 1e6
	p.Gbps = p.MBps * 8 / 1e3
	return nil
}

// pingPong does rounds 1-byte round trips and records p50, p99 and min.
func pingPong(ctx context.Context, dial dialFunc, dst string, rounds int, p *PathResult) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	c, done, err := openTest(ctx, dial, dst, modeEcho)
	if err != nil {
		return err
	}
	defer done()
	b := []byte{0}
	rtt := make([]time.Duration, 0, rounds)
	for i := range rounds + rounds/10 { // the first tenth warms up
		t0 := time.Now()
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		if i >= rounds/10 {
			rtt = append(rtt, time.Since(t0))
		}
	}
	slices.Sort(rtt)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	p.RoundTrips = len(rtt)
	p.P50us = us(rtt[len(rtt)/2])
	p.P99us = us(rtt[min(len(rtt)-1, len(rtt)*99/100)])
	p.Minus = us(rtt[0])
	return nil
}

// WriteJSON writes r, indented, to path.
func WriteJSON(path string, r *Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("demo: json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	return nil
}
