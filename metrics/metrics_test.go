package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/exn-project/exn/fabric"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// scrape serves reg over real HTTP and returns the exposition text.
func scrape(t testing.TB, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(Handler(reg))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	return string(b)
}

// lint fails t on any promlint problem in the exposition text.
func lint(t testing.TB, text string) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

func TestFabricCollector(t *testing.T) {
	var c fabric.Counters
	c.VELOSent.Add(3)
	c.RMAPosted[fabric.OpGet].Add(2)
	c.NotifyErrors[fabric.NErrBounds].Add(1)
	c.CountErr(fabric.ErrInUse)
	col := Fabric(7, c.Snapshot)

	reg, err := NewRegistry(col)
	if err != nil {
		t.Fatal(err)
	}
	text := scrape(t, reg)
	lint(t, text)

	for _, want := range []string{
		`exn_fabric_velo_messages_total{direction="tx",node="7"} 3`,
		`exn_fabric_rma_requests_total{node="7",op="get"} 2`,
		`exn_fabric_notification_errors_total{error="bounds",node="7"} 1`,
		`exn_fabric_errors_total{node="7",reason="in_use"} 1`,
		`go_goroutines`,
		`process_open_fds`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	// Values are read at scrape time, not at registration.
	c.VELOSent.Add(2)
	if n, err := testutil.GatherAndCount(reg, "exn_fabric_velo_messages_total"); err != nil || n != 2 {
		t.Errorf("velo_messages_total series = %d, %v; want 2 (tx, rx)", n, err)
	}
	if text := scrape(t, reg); !strings.Contains(text, `exn_fabric_velo_messages_total{direction="tx",node="7"} 5`) {
		t.Errorf("second scrape did not read the new value")
	}
}

func TestDuplicateCollectorRejected(t *testing.T) {
	var c fabric.Counters
	if _, err := NewRegistry(Fabric(1, c.Snapshot), Fabric(1, c.Snapshot)); err == nil {
		t.Fatal("registering the same node twice succeeded")
	}
}

// TestLintIsNotVacuous proves the promlint check would catch a badly
// named counter, so TestFabricCollector's clean lint means something.
func TestLintIsNotVacuous(t *testing.T) {
	b := &builder[fabric.Stats]{subsystem: "bad"}
	b.counter("frames", "A counter without _total.", func(s *fabric.Stats) uint64 { return 1 })
	reg, err := NewRegistry(b.collector(func() fabric.Stats { return fabric.Stats{} }))
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.New(strings.NewReader(scrape(t, reg))).Lint()
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) == 0 {
		t.Fatal("promlint accepted a counter named exn_bad_frames")
	}
}
