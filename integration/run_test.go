package integration

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"
)

// runExnd runs exnd outside any namespace, bounded to 10 s, and returns
// its output and exit code.
func runExnd(t *testing.T, exnd string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, exnd, args...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("exnd %q: %v", args, err)
	return "", -1
}
