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
	if !strings.Contains(out.String(), "2 pairs") {
		t.Errorf("table:\n%s", out.String())
	}
}
