package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"bogus"}, 2, "unknown subcommand"},
		{[]string{"-nodes", "1", "-json", "-", "-svg", "-"}, 1, "need at least 2"},
		{[]string{"demo", "extra"}, 2, "unexpected arguments"},
		{[]string{"-nodes", "x"}, 2, "invalid value"},
		{[]string{"-peers", "x"}, 2, "invalid value"},
		{[]string{"-budget", "-1s", "-json", "-", "-svg", "-"}, 1, "must not be negative"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != tc.code || !strings.Contains(errb.String(), tc.err) {
			t.Errorf("run(%q) = %d, stderr %q; want %d, %q", tc.args, code, errb.String(), tc.code, tc.err)
		}
	}
}

func TestRunDemoWritesFiles(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	code := run([]string{"-nodes", "2", "-time", "50ms", "-rtt", "50", "-dir", dir}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	// Not a terminal: no progress line, just the table and file names.
	if strings.Contains(out.String(), "\r") {
		t.Error("progress written to a non-terminal")
	}
	for _, f := range []string{"exnperf-results.json", "exnperf-results.svg"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	for _, want := range []string{"2 pairs", "2 of 2 ordered pairs", "load average"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// -all-pairs 0 samples even 4 nodes, -peers 0 leaves the ring alone.
func TestRunDemoRingOnly(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"-nodes", "4", "-all-pairs", "0", "-peers", "0", "-time", "50ms", "-rtt", "50", "-json", "-", "-svg", "-"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if want := "4 of 12 ordered pairs measured (ring i -> i+1 and 0 random peers per node"; !strings.Contains(out.String(), want) {
		t.Errorf("output lacks %q:\n%s", want, out.String())
	}
}
