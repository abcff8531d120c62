package check

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/internal/testenv"
)

// TestDringC builds shim/test/dring_test.c with shim/dring.c (with ASan
// and UBSan where gcc has them) and runs it: the connection buffer of
// docs/direct.md between forked processes, the test playing exnd (byte
// streams both ways with wraparound, wake-ups on data, space, fin, rst,
// poll and epoll readiness, forged cursors, a SIGKILLed peer, exnd's
// death, the relay flag, two forked writers under prod_lock).
func TestDringC(t *testing.T) {
	testenv.NeedGCC(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "dring_test")
	if err := testenv.CCSanitized("-O2", "-g", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o", bin,
		testenv.ModulePath("shim", "test", "dring_test.c"), testenv.ModulePath("shim", "dring.c")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	timer := time.AfterFunc(2*time.Minute, func() {
		if cmd.Process != nil {
			cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("dring_test: %v", err)
	}
	for _, name := range []string{"attach", "streams", "streams_big", "duplex", "semantics", "wake", "forged",
		"kill_rst", "kill_close", "exnd_death", "relay", "lock"} {
		if !strings.Contains(string(out), "ok "+name+"\n") {
			t.Errorf("test %s did not pass", name)
		}
	}
}
