package check

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/exn-project/exn/internal/testenv"
)

// TestExports: libextds.so exports exactly the entry points its linker
// version script (shim/libextds.map) names, and the sources mark exactly
// those EXPORT (built without the script, under -fvisibility=hidden, it
// exports the same set), so that neither an unlisted EXPORT (not
// interposed at all) nor a helper leaking into the application's symbol
// space can slip in.
func TestExports(t *testing.T) {
	testenv.NeedGCC(t)
	if _, err := exec.LookPath("nm"); err != nil {
		t.Skip("needs nm (binutils)")
	}
	want := mapExports(t, testenv.ModulePath("shim", "libextds.map"))
	lib, _ := build(t)
	compareExports(t, "libextds.so", dynExports(t, lib), want)

	nomap := filepath.Join(binDir, "libextds-nomap.so")
	if err := testenv.CompileShim(nomap, "MAP="); err != nil {
		t.Fatal(err)
	}
	compareExports(t, "libextds.so built without libextds.map", dynExports(t, nomap), want)
}

// mapExports returns the global symbols of a version script of the form
// { global: a; b; ... local: *; }.
func mapExports(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?s)/\*.*?\*/`).ReplaceAllString(string(b), "")
	text = regexp.MustCompile(`(?m)#.*$`).ReplaceAllString(text, "")
	m := regexp.MustCompile(`(?s)global:(.*?)local:\s*\*\s*;`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("%s: no \"global: ...; local: *;\"", path)
	}
	syms := map[string]bool{}
	for _, s := range strings.Split(m[1], ";") {
		if s = strings.TrimSpace(s); s != "" {
			if syms[s] {
				t.Errorf("%s: %s listed twice", path, s)
			}
			syms[s] = true
		}
	}
	if len(syms) == 0 {
		t.Fatalf("%s: no global symbols", path)
	}
	return syms
}

// dynExports returns the symbols lib defines in its dynamic symbol table
// (nm -D --defined-only), without version suffixes.
func dynExports(t *testing.T, lib string) map[string]bool {
	t.Helper()
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	if err != nil {
		t.Fatalf("nm -D --defined-only %s: %v", lib, err)
	}
	syms := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		name, _, _ := strings.Cut(f[len(f)-1], "@")
		syms[name] = true
	}
	return syms
}

func compareExports(t *testing.T, what string, got, want map[string]bool) {
	t.Helper()
	var extra, missing []string
	for s := range got {
		if !want[s] {
			extra = append(extra, s)
		}
	}
	for s := range want {
		if !got[s] {
			missing = append(missing, s)
		}
	}
	sort.Strings(extra)
	sort.Strings(missing)
	if len(extra) > 0 {
		t.Errorf("%s exports what libextds.map does not list: %v", what, extra)
	}
	if len(missing) > 0 {
		t.Errorf("%s does not export what libextds.map lists: %v", what, missing)
	}
	if len(extra) == 0 && len(missing) == 0 {
		t.Logf("%s: the %d symbols of libextds.map", what, len(got))
	}
}
