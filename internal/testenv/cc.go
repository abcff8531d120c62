package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// Building the C programs of the tests (the shim, its test programs and
// harnesses): the sources are found from the module's root, whatever
// directory the test binary runs in (go test runs it in its package's
// folder, perf/bench.sh from the repository root).

// ModuleRoot returns the exn module's directory: two levels above this
// file (internal/testenv) as it was when the test binary was compiled.
func ModuleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ModulePath returns the path of elem (joined as filepath.Join does) in
// the module, such as ModulePath("shim", "test", "shimtest.c").
func ModulePath(elem ...string) string {
	return filepath.Join(append([]string{ModuleRoot()}, elem...)...)
}

// NeedGCC skips t unless gcc is on PATH.
func NeedGCC(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("needs gcc")
	}
}

// CC runs gcc with args. Its error names the arguments and holds gcc's
// output.
func CC(args ...string) error {
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("gcc %v: %w\n%s", args, err, out)
	}
	return nil
}

// CCSanitized runs gcc with args under AddressSanitizer and UBSan (a
// program built so aborts on the first error it finds), or with args
// alone where gcc cannot build that (no libasan).
func CCSanitized(args ...string) error {
	san := append([]string{"-fsanitize=address,undefined", "-fno-sanitize-recover=all"}, args...)
	if CC(san...) == nil {
		return nil
	}
	return CC(args...)
}

// MustCC is CC failing t if gcc fails.
func MustCC(t testing.TB, args ...string) {
	t.Helper()
	if err := CC(args...); err != nil {
		t.Fatal(err)
	}
}

// CompileShim builds libextds.so at out with the shim's one build recipe,
// shim/Makefile (its sources, flags and version script), as the top
// Makefile's build target does; vars are extra make variables, such as
// "MAP=" (no version script).
func CompileShim(out string, vars ...string) error {
	abs, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	args := append([]string{"-s", "-B", "-C", ModulePath("shim"), "OUT=" + abs, "CC=gcc"}, vars...)
	if msg, err := exec.Command("make", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("make %v: %w\n%s", args, err, msg)
	}
	return nil
}

// A Built is a program (or library) the tests of a process build at most
// once, on first use, and share. The zero value is ready; a Built must
// not be copied after first use.
type Built struct {
	once sync.Once
	path string
	err  error
}

// Path returns the path of the program: the first call runs build, which
// builds it and returns its path; every call fails t if build failed.
func (b *Built) Path(t testing.TB, build func() (string, error)) string {
	t.Helper()
	b.once.Do(func() { b.path, b.err = build() })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}
