package testenv

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
)

// A helper process is the test binary run again as a child to play one
// role of a multi-process test: the parent starts it with StartHelper or
// StartPipedHelper, naming a test whose body is RunHelper, and passes it
// its parameters in environment variables.

// HelperCommand returns the command that re-executes the test binary to run
// only the test named test, with env (NAME=value) added to this process's
// environment and stderr shared with this process.
func HelperCommand(test string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	return cmd
}

// StartHelper starts HelperCommand(test, env...), failing t if it cannot.
// The child is killed and reaped when t ends.
func StartHelper(t testing.TB, test string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := HelperCommand(test, env...)
	startReaped(t, cmd)
	return cmd
}

// StartPipedHelper is StartHelper with the child's stdin and stdout piped
// to the returned ends.
func StartPipedHelper(t testing.TB, test string, env ...string) (*exec.Cmd, io.WriteCloser, io.ReadCloser) {
	t.Helper()
	cmd := HelperCommand(test, env...)
	stdin, stdout := Pipes(t, cmd)
	startReaped(t, cmd)
	return cmd, stdin, stdout
}

// Pipes returns the ends of pipes to cmd's stdin and from its stdout, to
// use once it starts, failing t if it cannot make them.
func Pipes(t testing.TB, cmd *exec.Cmd) (io.WriteCloser, io.ReadCloser) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	return stdin, stdout
}

func startReaped(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
}

// RunHelper is the body of a helper-process test: it skips t unless the
// environment variable env is set (the test runs as itself, not as a
// child), else runs main with the variable's value and exits the process:
// 0 if main succeeds, 1 after printing its error, prefixed by name, on
// stderr.
func RunHelper(t testing.TB, env, name string, main func(string) error) {
	v := os.Getenv(env)
	if v == "" {
		t.Skipf("helper process (%s runs it with %s set)", name, env)
	}
	if err := main(v); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}
