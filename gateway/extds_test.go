package gateway

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
)

// TestEXTDSPart: exnd serves the shim operations, registers shim
// listeners (shim-listen, counted in shim-stats until shim-unlisten),
// answers shim-connect for an unknown peer with plain TCP, shows EXT-DS
// in conns, stats, shim-stats and /metrics, and closes without error.
func TestEXTDSPart(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	c := mem.NewCluster()
	n := startNode(t, c, memConfig(t, 1))
	cl := dial(t, n.cfg.Control)
	listens := func() int {
		var ss struct{ Listens int }
		call(t, cl, &ss, "shim-stats")
		return ss.Listens
	}
	var hello struct{ Version int }
	call(t, cl, &hello, "shim-hello", strconv.Itoa(shimsrv.Version))
	if hello.Version != shimsrv.Version {
		t.Fatalf("shim-hello: %+v", hello)
	}
	// shim-listen takes the listening socket; exnd reads its port.
	l7, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f7, err := l7.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithTimeout(t.Context(), 5*time.Second)
	_, err = cl.CallFD(lctx, nil, []*os.File{f7}, "shim-listen")
	lcancel()
	f7.Close()
	if err != nil || listens() != 1 {
		t.Fatalf("shim-listen: %v, %d listens", err, listens())
	}
	l7.Close()
	call(t, cl, nil, "shim-unlisten", strconv.Itoa(l7.Addr().(*net.TCPAddr).Port))
	if n := listens(); n != 0 {
		t.Fatalf("%d listens after the socket closed and shim-unlisten", n)
	}

	// A socket to a peer the neighbour table does not know stays TCP.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if s, err := ln.Accept(); err == nil {
			s.Close()
		}
	}()
	f, err := testenv.DialTCP(t, ln).File()
	if err != nil {
		t.Fatal(err)
	}
	var res struct{ Mode, Reason string }
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	out, err := cl.CallFD(ctx, &res, []*os.File{f}, "shim-connect")
	cancel()
	f.Close()
	if err != nil || out != nil || res.Mode != "tcp" || res.Reason != "no_route" {
		t.Fatalf("shim-connect: %+v, fd %v, %v", res, out != nil, err)
	}

	var conns []json.RawMessage
	call(t, cl, &conns, "conns")
	if len(conns) != 0 {
		t.Fatalf("conns %s", conns)
	}
	var st struct {
		EXTDS map[string]json.RawMessage `json:"extds"`
	}
	call(t, cl, &st, "stats")
	var ss struct {
		Switched  uint64
		Fallbacks map[string]uint64
	}
	call(t, cl, &ss, "shim-stats")
	if ss.Switched != 0 || ss.Fallbacks["no_route"] != 1 {
		t.Fatalf("shim-stats %+v", ss)
	}
	if m := scrapeMetrics(t, n.d.MetricsAddr()); !strings.Contains(m, `exn_extds_fallbacks_total{node="1",reason="no_route"} 1`) {
		t.Fatal("metrics lack the EXT-DS fallback")
	}

	if err := n.d.Close(); err != nil {
		t.Fatal(err)
	}
}
