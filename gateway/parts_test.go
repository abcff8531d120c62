package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/tap/taptest"
)

// withParts makes Start run ps instead of stdParts.
func withParts(ps ...part) Option {
	if ps == nil {
		ps = []part{}
	}
	return func(o *options) { o.parts = ps }
}

// TestPartHook is the contract an optional part (EXT-DS, extds.go) relies
// on: what it sets before the control socket and metrics start shows in
// conns, stats and /metrics, its handlers are served, and its closer runs
// on Close.
func TestPartHook(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	closed := 0
	fake := withParts(part{name: "fake", start: func(d *Daemon) (started, error) {
		d.conns = func(context.Context) any { return []map[string]any{{"id": 7, "mode": "extds"}} }
		d.extdsStats = func() extds.Stats { return extds.Stats{ConnsEXTDS: 5, Active: 1} }
		hello := func(_ context.Context, args []string) (any, error) { return "hi " + strings.Join(args, ","), nil }
		return started{close: func() error { closed++; return nil }, ops: map[string]control.HandlerFunc{"hello": hello}}, nil
	}})
	n := startNode(t, mem.NewCluster(), memConfig(t, 1), fake)
	c := dial(t, n.cfg.Control)

	var conns []map[string]any
	call(t, c, &conns, "conns")
	if len(conns) != 1 || conns[0]["mode"] != "extds" {
		t.Fatalf("conns %v", conns)
	}
	var st struct {
		EXTDS map[string]json.RawMessage `json:"extds"`
	}
	call(t, c, &st, "stats")
	if string(st.EXTDS["conns_extds"]) != "5" || string(st.EXTDS["active"]) != "1" {
		t.Fatalf("stats.extds %v", st.EXTDS)
	}
	var hi string
	call(t, c, &hi, "hello", "a", "b")
	if hi != "hi a,b" {
		t.Fatalf("hello = %q", hi)
	}
	m := scrapeMetrics(t, n.d.MetricsAddr())
	if !strings.Contains(m, `exn_extds_connections_total{mode="extds",node="1"} 5`) || !strings.Contains(m, `exn_extds_active_connections{node="1"} 1`) {
		t.Fatalf("metrics lack EXT-DS series")
	}
	if err := n.d.Close(); err != nil || closed != 1 {
		t.Fatalf("Close = %v, part closed %d times", err, closed)
	}
}

// TestPartStartFails: a part that fails to start fails Start, naming the
// part, and everything started before it (including earlier parts) is
// closed.
func TestPartStartFails(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	closed := false
	parts := withParts(
		part{name: "first", start: func(d *Daemon) (started, error) {
			return started{close: func() error { closed = true; return nil }}, nil
		}},
		part{name: "broken", start: func(d *Daemon) (started, error) { return started{}, errors.New("no vpid") }},
	)
	c := mem.NewCluster()
	_, err := Start(memConfig(t, 1), slog.New(slog.DiscardHandler), WithDevice(taptest.New("exnt", 0)), WithMemCluster(c), parts)
	if err == nil || !strings.Contains(err.Error(), "start broken: no vpid") || !closed {
		t.Fatalf("Start = %v, first part closed %v", err, closed)
	}
	// The node ID is free again.
	startNode(t, c, memConfig(t, 1), withParts())
}

// TestPartDuplicateOp: two parts that serve the same control operation
// fail Start, naming the operation, and both (each started) are closed.
func TestPartDuplicateOp(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	closed := 0
	op := func(context.Context, []string) (any, error) { return nil, nil }
	mk := func(name string) part {
		return part{name: name, start: func(d *Daemon) (started, error) {
			return started{close: func() error { closed++; return nil }, ops: map[string]control.HandlerFunc{"same": op}}, nil
		}}
	}
	_, err := Start(memConfig(t, 1), slog.New(slog.DiscardHandler), WithDevice(taptest.New("exnt", 0)),
		WithMemCluster(mem.NewCluster()), withParts(mk("a"), mk("b")))
	if err == nil || !strings.Contains(err.Error(), `start b: control operation "same" registered twice`) || closed != 2 {
		t.Fatalf("Start = %v, closed %d", err, closed)
	}
}

// TestStdPartsOrder pins the start order documented in parts.go.
func TestStdPartsOrder(t *testing.T) {
	var names []string
	for _, p := range stdParts() {
		names = append(names, p.name)
	}
	if got := strings.Join(names, ","); got != "extds,liveness,netstack services" {
		t.Fatalf("stdParts = %s", got)
	}
}
