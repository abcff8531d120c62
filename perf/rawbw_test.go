//go:build ofi

package perf

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestOFIRawBW holds perf/testdata/ofi_rma_bw.c, the libfabric baseline
// of perf/ofi-exn0.sh RAW=1, to what the script parses: it builds the
// tool (sanitized), runs a target and a client on loopback over ofi:tcp
// for a fraction of a second, and checks that GETs moved and that both
// sides' CPU time came back. A run that moves nothing, or a tool that no
// longer builds against this libfabric, fails here and not in a
// benchmark.
func TestOFIRawBW(t *testing.T) {
	testenv.NeedGCC(t)
	bin := t.TempDir() + "/ofi_rma_bw"
	testenv.MustCC(t, "-O1", "-g", "-Wall", "-Werror", "-o", bin, testenv.ModulePath("perf", "testdata", "ofi_rma_bw.c"), "-lfabric")
	port := strconv.Itoa(20000 + os.Getpid()%20000)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	target := exec.CommandContext(ctx, bin, "-s", "127.0.0.1", "-p", "tcp", "-P", port)
	target.Stderr = os.Stderr
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	defer target.Wait() //nolint:errcheck // the client's end ends it; an error is the client's to report
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "-c", "127.0.0.1", "-p", "tcp", "-P", port, "-w", "4", "-t", "0.3").Output()
	if err != nil {
		t.Fatalf("client: %v (%s)", err, out)
	}
	m := regexp.MustCompile(`gbit=([0-9.]+) client_cpu_s=([0-9.]+) target_cpu_s=([0-9.]+) cpu_s_per_gb=([0-9.]+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("unexpected output %q", out)
	}
	for i, name := range []string{"gbit", "client_cpu_s", "target_cpu_s", "cpu_s_per_gb"} {
		if v, _ := strconv.ParseFloat(m[i+1], 64); v <= 0 {
			t.Errorf("%s = %s, want > 0 (%q)", name, m[i+1], out)
		}
	}
	t.Logf("%s", out)
}
