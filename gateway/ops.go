package gateway

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"reflect"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/exn"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabnet"
	"github.com/exn-project/exn/fabric/members"
	"github.com/exn-project/exn/metrics"
	"github.com/exn-project/exn/tap"
	"github.com/prometheus/client_golang/prometheus"
)

// Ping limits of the control "ping" operation.
const (
	MaxPingCount = 10000
	PingTimeout  = time.Second // per ping
)

// startMetrics listens on cfg.Metrics and serves /metrics from a private
// registry with every layer's collector.
func (d *Daemon) startMetrics() error {
	d.pingRTT = metrics.PingRTT(d.cfg.Node)
	if d.cfg.Metrics == "" {
		return nil
	}
	cs := []prometheus.Collector{
		metrics.Fabric(d.cfg.Node, d.nic.Stats),
		metrics.Engine(d.cfg.Node, d.engine.Stats),
		metrics.TAP(d.cfg.Node, d.dev.Name(), d.tapStats),
		metrics.Neighbors(d.cfg.Node, d.arp.Stats),
		d.pingRTT,
	}
	if d.extdsStats != nil {
		cs = append(cs, metrics.EXTDS(d.cfg.Node, d.extdsStats))
	}
	if d.shimStats != nil {
		cs = append(cs, metrics.Shim(d.cfg.Node, d.shimStats))
	}
	if d.remoteStats != nil {
		cs = append(cs, metrics.DirectRemote(d.cfg.Node, d.remoteStats))
	}
	if d.attachStats != nil {
		cs = append(cs, metrics.Attach(d.cfg.Node, d.attachStats))
	}
	if r, ok := d.nic.(membershipReporter); ok {
		if _, on := r.MembershipStats(); on {
			fab, _ := d.nic.(*fabnet.NIC) // net also has its sessions' counters
			cs = append(cs, metrics.Membership(d.cfg.Node, func() metrics.MembershipStats {
				r, _ := r.MembershipStats()
				s := metrics.MembershipStats{DatagramsIn: r.Transport.In, DatagramsOut: r.Transport.Out, Streams: r.Transport.Streams,
					Foreign: r.Transport.Foreign, Dropped: r.Transport.Dropped, DeclaredDead: r.DeclaredDead, Members: r.Members.Alive}
				if fab != nil {
					n := fab.NetStats()
					s.Sessions, s.Activated, s.ConnectTimeouts = n.Sessions, n.Activated, n.ConnectTimeouts
					s.DialAsks, s.DialAsked, s.MulticastOut, s.MulticastIn = n.DialAsks, n.DialAsked, n.MulticastOut, n.MulticastIn
					s.MulticastDropped, s.BadDatagrams = n.MulticastDropped, n.BadDatagrams
				}
				return s
			}))
		}
	}
	cs = append(cs, metrics.Control(d.cfg.Node, d.controlStats))
	reg, err := metrics.NewRegistry(cs...)
	if err != nil {
		return fmt.Errorf("metrics registry: %w", err)
	}
	d.reg = reg
	ln, err := net.Listen("tcp", d.cfg.Metrics)
	if err != nil {
		return fmt.Errorf("%s: %w", d.cfg.field("metrics"), err)
	}
	d.metricsLn = ln
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(reg))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintln(w, "exnd: metrics at /metrics")
	})
	d.http = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.fail(fmt.Errorf("metrics server: %w", err))
		}
	}()
	return nil
}

// MetricsAddr is the address /metrics is served on ("" if off); with a
// port of 0 in --metrics it carries the port chosen.
func (d *Daemon) MetricsAddr() string {
	if d.metricsLn == nil {
		return ""
	}
	return d.metricsLn.Addr().String()
}

// startControl serves the control socket at cfg.Control.
func (d *Daemon) startControl() error {
	if d.cfg.Control == "" {
		return nil
	}
	s := control.NewServer(d.log.With("part", "control"))
	s.SetPolicy(d.cfg.ControlAccess)
	for op, h := range d.handlers() {
		s.Handle(op, h)
	}
	// Every operation is registered before the socket is served: a shim
	// request that arrived before its handler would fail a connection.
	for op, h := range d.extraFDHandlers {
		s.HandleFD(op, h)
	}
	d.ctlStats.Store(s) // before Listen: every request sees its counters
	if err := s.Listen(d.cfg.Control); err != nil {
		d.ctlStats.Store(nil)
		s.Close()
		if d.cfg.controlIsDefault {
			// Several nodes on one host (one per namespace) share the
			// default path; only a chosen path must be served.
			d.log.Warn("no control socket: exnctl and libextds.so cannot reach this exnd; give each node its own --control",
				"err", err)
			return nil
		}
		return fmt.Errorf("%s: %w", d.cfg.field("control"), err)
	}
	d.ctl = s
	return nil
}

// handlers are every control operation: the daemon's own and the parts'.
func (d *Daemon) handlers() map[string]control.HandlerFunc {
	hs := map[string]control.HandlerFunc{
		"status":    d.noArgs(func() any { return d.Status() }),
		"neighbors": d.noArgs(func() any { return d.Neighbors() }),
		"stats":     d.noArgs(func() any { return d.Stats() }),
		"conns":     d.connList,
		"ping":      d.handlePing,
	}
	for op, h := range d.extraHandlers {
		hs[op] = h
	}
	return hs
}

func (d *Daemon) noArgs(f func() any) control.HandlerFunc {
	return func(_ context.Context, args []string) (any, error) {
		if len(args) != 0 {
			return nil, fmt.Errorf("takes no arguments, have %q", strings.Join(args, " "))
		}
		return f(), nil
	}
}

func (d *Daemon) tapStats() tap.Stats {
	if s, ok := d.dev.(interface{ Stats() tap.Stats }); ok {
		return s.Stats()
	}
	return tap.Stats{}
}

func (d *Daemon) connList(ctx context.Context, args []string) (any, error) {
	if len(args) != 0 {
		return nil, fmt.Errorf("takes no arguments, have %q", strings.Join(args, " "))
	}
	if d.conns == nil {
		return []struct{}{}, nil
	}
	return d.conns(ctx), nil
}

// Status is the reply to "status".
type Status struct {
	Node           fabric.NodeID `json:"node"`
	MAC            string        `json:"mac"`
	Fabric         string        `json:"fabric"`
	Ifname         string        `json:"ifname"`
	MTU            int           `json:"mtu"`
	Addrs          []string      `json:"addrs"`
	EagerThreshold int           `json:"eager_threshold"`
	UptimeSeconds  float64       `json:"uptime_seconds"`
	Version        string        `json:"version"`
	PID            int           `json:"pid"`
	Control        string        `json:"control"`
	Metrics        string        `json:"metrics,omitempty"`
}

// Status describes the node.
func (d *Daemon) Status() Status {
	addrs := make([]string, len(d.cfg.Addrs))
	for i, a := range d.cfg.Addrs {
		addrs[i] = a.String()
	}
	return Status{
		Node:           d.cfg.Node,
		MAC:            d.MAC().String(),
		Fabric:         d.cfg.Fabric.String(),
		Ifname:         d.dev.Name(),
		MTU:            d.dev.MTU(),
		Addrs:          addrs,
		EagerThreshold: d.cfg.EagerThreshold,
		UptimeSeconds:  math.Round(time.Since(d.started).Seconds()*1000) / 1000,
		Version:        Version(),
		PID:            os.Getpid(),
		Control:        d.cfg.Control,
		Metrics:        d.MetricsAddr(),
	}
}

// Version is exnd's module version and the Go release that built it.
func Version() string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return v + " " + runtime.Version()
}

// Neighbor is one row of the reply to "neighbors".
type Neighbor struct {
	IP         string        `json:"ip"`
	MAC        string        `json:"mac"`
	Node       fabric.NodeID `json:"node"`
	Source     string        `json:"source"`
	AgeSeconds float64       `json:"age_seconds"`
}

// Neighbors is the neighbour table, sorted by IP.
func (d *Daemon) Neighbors() []Neighbor {
	es := d.arp.Neighbors()
	out := make([]Neighbor, len(es))
	for i, e := range es {
		out[i] = Neighbor{IP: e.IP.String(), MAC: e.MAC.String(), Node: e.Node, Source: e.Source.String(),
			AgeSeconds: math.Round(time.Since(e.Updated).Seconds()*10) / 10}
	}
	return out
}

// Stats is the reply to "stats": every layer's counters, with
// snake_case names, the engine's per-protocol arrays and drops keyed by
// name.
func (d *Daemon) Stats() map[string]any {
	out := map[string]any{
		"fabric": snake(d.nic.Stats()),
		"engine": engineStats(d.engine.Stats()),
		"tap":    snake(d.tapStats()),
		"arp":    snake(d.arp.Stats()),
	}
	out["control"] = d.controlStats()
	if d.shimStats != nil {
		out["shim"] = d.shimStats()
	}
	if d.remoteStats != nil {
		st := d.remoteStats()
		m := snake(st)
		m["resets"] = st.ResetsByReason()
		out["direct_remote"] = m
	}
	if d.extdsStats != nil {
		out["extds"] = snake(d.extdsStats())
	}
	return out
}

func engineStats(s exn.Stats) map[string]any {
	byProto := func(a [exn.NumProtos]uint64) map[string]uint64 {
		m := make(map[string]uint64, exn.NumProtos)
		for p := range exn.NumProtos {
			m[p.String()] = a[p]
		}
		return m
	}
	drops := make(map[string]uint64, exn.NumDropReasons)
	for r := exn.DropNone + 1; r < exn.NumDropReasons; r++ {
		drops[r.String()] = s.Drops[r]
	}
	out := snake(s)
	out["tx_frames"], out["tx_bytes"] = byProto(s.TxFrames), byProto(s.TxBytes)
	out["rx_frames"], out["rx_bytes"] = byProto(s.RxFrames), byProto(s.RxBytes)
	out["drops"] = drops
	return out
}

// snake turns a flat stats struct into a map keyed by its field names in
// snake_case (VELOSentBytes → velo_sent_bytes).
func snake(v any) map[string]any {
	rv := reflect.ValueOf(v)
	rt := rv.Type()
	out := make(map[string]any, rt.NumField())
	for i := range rt.NumField() {
		if f := rt.Field(i); f.IsExported() {
			out[snakeName(f.Name)] = rv.Field(i).Interface()
		}
	}
	return out
}

func snakeName(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) {
			// A new word starts at an upper-case letter that follows a
			// lower-case one, or that precedes one inside an acronym
			// (VELOSent → velo_sent).
			if i > 0 && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]) && unicode.IsUpper(r[i-1]))) {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}

// PingReply is the reply to "ping NODE COUNT", in the style of ibping:
// every round-trip time and their summary, in microseconds.
type PingReply struct {
	Node        fabric.NodeID `json:"node"`
	Transmitted int           `json:"transmitted"`
	Received    int           `json:"received"`
	LossPercent float64       `json:"loss_percent"`
	RTTMicros   []float64     `json:"rtt_us"`
	MinMicros   float64       `json:"min_us"`
	AvgMicros   float64       `json:"avg_us"`
	MaxMicros   float64       `json:"max_us"`
	LastError   string        `json:"last_error,omitempty"`
}

func (d *Daemon) handlePing(ctx context.Context, args []string) (any, error) {
	if len(args) < 1 || len(args) > 2 {
		return nil, fmt.Errorf("ping: want NODE [COUNT], have %d arguments", len(args))
	}
	n, err := strconv.ParseUint(args[0], 10, 16)
	if err != nil {
		return nil, fmt.Errorf("ping: node %q: want 0-65535", args[0])
	}
	count := 1
	if len(args) == 2 {
		if count, err = strconv.Atoi(args[1]); err != nil || count < 1 || count > MaxPingCount {
			return nil, fmt.Errorf("ping: count %q: want 1-%d", args[1], MaxPingCount)
		}
	}
	return d.Ping(ctx, fabric.NodeID(n), count)
}

// Ping sends count fabric pings to node, one after the other, each given
// PingTimeout, and feeds the RTT histogram. It fails only if no reply
// came back at all.
func (d *Daemon) Ping(ctx context.Context, node fabric.NodeID, count int) (PingReply, error) {
	r := PingReply{Node: node, RTTMicros: []float64{}}
	var sum float64
	for range count {
		if ctx.Err() != nil {
			break
		}
		r.Transmitted++
		pctx, cancel := context.WithTimeout(ctx, PingTimeout)
		rtt, err := d.ping.Ping(pctx, node)
		cancel()
		if err != nil {
			r.LastError = err.Error()
			continue
		}
		d.pingRTT.Observe(rtt.Seconds())
		us := float64(rtt.Nanoseconds()) / 1e3
		r.RTTMicros = append(r.RTTMicros, us)
		if r.Received == 0 || us < r.MinMicros {
			r.MinMicros = us
		}
		r.MaxMicros = max(r.MaxMicros, us)
		sum += us
		r.Received++
	}
	if r.Transmitted > 0 {
		r.LossPercent = 100 * float64(r.Transmitted-r.Received) / float64(r.Transmitted)
	}
	if r.Received == 0 {
		return r, fmt.Errorf("ping node %d: no reply to %d pings: %s", node, r.Transmitted, r.LastError)
	}
	r.AvgMicros = sum / float64(r.Received)
	return r, nil
}

// controlStats is the control server's counters (zero without one).
func (d *Daemon) controlStats() control.ServerStats {
	ctl := d.ctlStats.Load()
	if ctl == nil {
		return control.ServerStats{Refused: map[string]uint64{}}
	}
	return ctl.Stats()
}

// membershipReporter is a NIC that runs membership (fabric/fabnet and
// fabric/ofi under their swim liveness).
type membershipReporter interface {
	MembershipStats() (members.Report, bool)
}
