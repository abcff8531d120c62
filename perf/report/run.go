package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// Options configure a report run.
type Options struct {
	Quick bool
	Count int    // runs per benchmark, medians over them (0: 3, or 1 with Quick)
	Out   string // docs directory: benchmarks.md and charts/ go there
	// Results is where each section's JSON is saved and, for sections not
	// run this time, read from (default Out/results).
	Results string
	// From: read results from this directory only and run nothing.
	From string
	Only []string // section IDs (or prefixes like "fabric"); empty: all
	Note string   // appended to the machine note
	Root string   // module root (default: found from the working directory)
	// Progress, when set, gets one updating status line (a terminal).
	Progress io.Writer
	// Log gets one line per finished section; nil for quiet.
	Log io.Writer
}

func (o *Options) params() Params {
	c := o.Count
	if c <= 0 {
		c = 3
		if o.Quick {
			c = 1
		}
	}
	return Params{Quick: o.Quick, Count: c}
}

// Selected returns the sections o.Only names, in matrix order.
func (o *Options) Selected() ([]Section, error) {
	if len(o.Only) == 0 {
		return Sections, nil
	}
	var out []Section
	for _, s := range Sections {
		for _, want := range o.Only {
			if s.ID == want || strings.HasPrefix(s.ID, want+"-") {
				out = append(out, s)
				break
			}
		}
	}
	for _, want := range o.Only {
		found := false
		for _, s := range Sections {
			found = found || s.ID == want || strings.HasPrefix(s.ID, want+"-")
		}
		if !found {
			return nil, fmt.Errorf("unknown section %q (have %s)", want, strings.Join(SectionIDs(), ", "))
		}
	}
	return out, nil
}

// SectionIDs lists the section IDs in order.
func SectionIDs() []string {
	var ids []string
	for _, s := range Sections {
		ids = append(ids, s.ID)
	}
	return ids
}

// FindRoot walks up from dir to the exn module's go.mod.
func FindRoot(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.Contains(b, []byte("module github.com/exn-project/exn\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no exn go.mod above %s", dir)
		}
	}
}

// Report runs the selected sections (unless o.From is set), saves their
// results, and writes the document and charts from every section's
// results available.
func Report(ctx context.Context, o Options) error {
	if o.Out == "" {
		o.Out = "docs"
	}
	if o.Results == "" {
		o.Results = filepath.Join(o.Out, "results")
	}
	src := o.Results
	if o.From != "" {
		src = o.From
	}
	have, err := LoadDir(src)
	if err != nil {
		return err
	}
	sel, err := o.Selected()
	if err != nil {
		return err
	}
	if o.From == "" {
		if o.Root == "" {
			wd, _ := os.Getwd()
			if o.Root, err = FindRoot(wd); err != nil {
				return err
			}
		}
		machine := MachineNote()
		p := o.params()
		prog := newProgress(o.Progress, len(sel))
		for i, s := range sel {
			prog.set(i, s.ID)
			t0 := time.Now()
			sf := RunSection(ctx, o.Root, s, p)
			sf.Machine = machine
			if ctx.Err() != nil {
				prog.stop()
				return ctx.Err()
			}
			if err := sf.Save(o.Results); err != nil {
				prog.stop()
				return err
			}
			have[s.ID] = sf
			if o.Log != nil {
				prog.clear()
				state := fmt.Sprintf("%d results", len(sf.Results))
				if sf.Skipped != "" {
					state = "skipped: " + sf.Skipped
				}
				fmt.Fprintf(o.Log, "%-14s %6.0fs  %s\n", s.ID, time.Since(t0).Seconds(), state)
			}
		}
		prog.stop()
	} else if len(o.Only) > 0 {
		keep := map[string]*SectionFile{}
		for _, s := range sel {
			if sf, ok := have[s.ID]; ok {
				keep[s.ID] = sf
			}
		}
		have = keep
	}
	var files []*SectionFile
	for _, s := range Sections {
		if sf, ok := have[s.ID]; ok {
			files = append(files, sf)
		}
	}
	if len(files) == 0 {
		return errors.New("no results to report")
	}
	if err := os.MkdirAll(filepath.Join(o.Out, "charts"), 0o755); err != nil {
		return err
	}
	charts, err := WriteCharts(filepath.Join(o.Out, "charts"), files)
	if err != nil {
		return err
	}
	appendix, err := readAppendix(filepath.Join(o.Out, "benchmarks.d"))
	if err != nil {
		return err
	}
	doc := Markdown(files, DocOptions{Note: o.Note, Charts: charts, ResultsDir: relTo(o.Out, o.Results), Appendix: appendix})
	return os.WriteFile(filepath.Join(o.Out, "benchmarks.md"), []byte(doc), 0o644)
}

// readAppendix reads the hand-written sections in dir (*.md, in name
// order); a missing dir is none.
func readAppendix(dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
	}
	return out, nil
}

func relTo(base, p string) string {
	if r, err := filepath.Rel(base, p); err == nil {
		return r
	}
	return p
}

// RunSection runs one section as a child go test and extracts its
// results. Failures and skips are recorded in the SectionFile, not
// returned: one broken benchmark must not lose the others.
func RunSection(ctx context.Context, root string, s Section, p Params) *SectionFile {
	cmd := s.Command(p)
	sf := &SectionFile{Section: s.ID, Title: s.Title, Command: cmd, Count: p.Count, Time: time.Now().UTC().Truncate(time.Second)}
	if s.Root {
		if why := privileged(s.Needs); why != "" {
			sf.Skipped = why
			return sf
		}
	}
	c := exec.CommandContext(ctx, "go", s.GoArgs(p)...)
	c.Dir = root
	c.Env = os.Environ()
	if s.Env != nil {
		c.Env = append(c.Env, s.Env(p)...)
	}
	c.Cancel = func() error { return c.Process.Signal(os.Interrupt) }
	c.WaitDelay = 30 * time.Second
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	runErr := c.Run()
	st, err := ParseJSON(&stdout)
	if err != nil {
		sf.Notes = append(sf.Notes, "parse: "+err.Error())
	}
	if st != nil {
		sf.Results, sf.Notes = s.Extract(st, cmd)
		if s.ID != "shim" { // the shim's extractor reports its own skips
			for _, sk := range st.Skips {
				sf.Notes = append(sf.Notes, "skipped: "+sk)
			}
		}
		if len(st.Failed) > 0 {
			sf.Notes = append(sf.Notes, "failed: "+strings.Join(st.Failed, ", "))
		}
	}
	if runErr != nil {
		msg := runErr.Error()
		if t := tail(stderr.String(), 400); t != "" {
			msg += ": " + t
		} else if st != nil {
			msg += ": " + tail(strings.Join(st.Lines, "\n"), 400)
		}
		sf.Notes = append(sf.Notes, "go test: "+msg)
	}
	if len(sf.Results) == 0 && sf.Skipped == "" {
		sf.Skipped = "no results"
		if st != nil && len(st.Skips) > 0 {
			sf.Skipped = st.Skips[0]
		} else if runErr != nil {
			sf.Skipped = "go test failed: " + tail(stderr.String()+"\n"+strings.Join(st.Lines, "\n"), 300)
		}
	}
	return sf
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

// privileged says why the namespace benchmarks cannot run here ("" if
// they can), the same checks as internal/testenv.RequirePrivileged.
func privileged(needs []string) string {
	if os.Geteuid() != 0 {
		return "needs root (network namespaces)"
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return "needs /dev/net/tun"
	}
	for _, p := range needs {
		if _, err := exec.LookPath(p); err != nil {
			return "needs " + p + " on PATH (make deps installs it)"
		}
	}
	return ""
}

// MachineNote describes the machine: CPU model and count, kernel, Go,
// load average when the run started.
func MachineNote() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = ", load average " + strings.Join(f[:3], " ") + " at start"
		}
	}
	return fmt.Sprintf("%s, %d vCPUs%s, %s%s", model, runtime.NumCPU(), kernel, runtime.Version(), load)
}

// IsTerminal reports whether f is a character device (a terminal).
func IsTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress keeps one status line updated once a second.
type progress struct {
	w     io.Writer
	total int
	start time.Time
	mu    sync.Mutex
	i     int
	name  string
	since time.Time
	done  chan struct{}
	once  sync.Once
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now(), done: make(chan struct{})}
	if w != nil {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-p.done:
					return
				case <-t.C:
					p.draw()
				}
			}
		}()
	}
	return p
}

func (p *progress) set(i int, name string) {
	p.mu.Lock()
	p.i, p.name, p.since = i, name, time.Now()
	p.mu.Unlock()
	p.draw()
}

func (p *progress) draw() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s %s (total %s)", p.i+1, p.total, p.name,
		time.Since(p.since).Truncate(time.Second), time.Since(p.start).Truncate(time.Second))
}

func (p *progress) clear() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	fmt.Fprint(p.w, "\r\033[K")
	p.mu.Unlock()
}

func (p *progress) stop() {
	p.once.Do(func() {
		close(p.done)
		p.clear()
	})
}
