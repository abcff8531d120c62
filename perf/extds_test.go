package perf

// BenchmarkExtDS: EXT-DS between two application processes attached to
// two exnds (kernel bypass on shm) against the same Go client and server
// over TCP on exn0 between the same two namespaces, and over a veth pair
// between two other namespaces, all in one run (issue #5).
//
// Processes (every one is this test binary, re-executed with
// dsRoleEnv set; init runs the role instead of the tests):
//
//	ns n1: exnd node 1 ── shm fabric ── exnd node 2 :ns n2
//	ns n1: client (attached to node 1)   server (attached to node 2) :ns n2
//	         ├ EXT-DS dial n2:dsPort ──────→ extds.Listen (kernel bypass)
//	         └ TCP dial n2:tcpPort over exn0 → net.Listen
//	ns va: client ──── veth ────────────────→ net.Listen :ns vb
//
// Each repetition (EXN_PERF_REPS, default 3) runs one client process per
// variant, in the order EXT-DS, exn0, veth; a client runs every ping-pong
// size and every stream size on fresh connections and prints its results
// as one JSON line. The table gives medians over the repetitions, the
// per-run values and the ratios against TCP over exn0 with the bars.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/integration/nstest"
	"github.com/exn-project/exn/internal/testenv"
)

// Environment of the re-executed helper processes.
const (
	dsRoleEnv = "EXN_PERF_DS_ROLE"    // "server" or "client"
	dsCtlEnv  = "EXN_PERF_DS_CONTROL" // exnd's control socket; empty: no attach, TCP only
	dsAddrEnv = "EXN_PERF_DS_ADDR"    // client: host:port to dial
	dsPathEnv = "EXN_PERF_DS_PATH"    // client: "extds" or "tcp"
	dsCopyEnv = "EXN_PERF_DS_COPY"    // "1": both ends move stream data with io.Copy
	dsHashEnv = "EXN_PERF_DS_HASH"    // "1": the server sha256-hashes stream data (a receiver that works per byte)
	dsRingEnv = "EXN_PERF_DS_RING"    // extds.WithRingSize for the attached Device (bytes; default: the library's)
	// dsAltEnv: space-separated NAME=VALUE environment for a fourth
	// variant, "EXT-DS alt": its own attached server and client with that
	// environment (e.g. EXN_PERF_DS_RING=1048576), compared with EXT-DS in
	// the same run.
	dsAltEnv = "EXN_PERF_DS_ALT"
	// dsProfEnv: a directory; every helper process writes its CPU profile
	// there (ROLE-PID.prof) for `go tool pprof`.
	dsProfEnv  = "EXN_PERF_DS_CPUPROFILE"
	dsResultPf = "RESULT "
	dsListenPf = "LISTEN "
)

// Connection kinds: the first byte a client sends.
const (
	dsKindPing   = 'P' // u32 size, then size-byte messages echoed until EOF
	dsKindStream = 'T' // data until EOF; the server answers the u64 byte count
)

// Load bounds of one client run. Every loop is bounded in count and time.
const (
	// dsPingIters round trips per size after dsPingWarm warm-up ones:
	// enough for a stable p99 (20 samples above it), about 0.2 s at the
	// 80 µs round trips of TCP over exn0.
	dsPingIters = 2000
	dsPingWarm  = 200
	// dsPingTime caps one size's ping-pong (a loaded host).
	dsPingTime = 3 * time.Second
	// dsStreamBytes caps one stream: 1 GiB would take seconds at the
	// rates here; 256 MiB is 0.2–0.4 s at 0.7–1.3 GB/s and still many ring
	// turns. Writes below 1 KiB send 16 MiB (tens of MB/s).
	dsStreamBytes      = 256 << 20
	dsStreamSmallBytes = 16 << 20
	// dsStreamTime caps one stream's writing; the rate is what was sent
	// in the time it took.
	dsStreamTime = 1500 * time.Millisecond
	// dsClockEvery: the stream loop reads the clock every this many writes
	// (a clock read per 64 B write would cost a few percent).
	dsClockEvery = 64
	// dsReadBuf is the server's read buffer for streams, the same on every
	// path (a TCP read of 8 KiB would measure syscalls, not the path).
	dsReadBuf = 256 << 10
	// dsClientTimeout bounds one client process.
	dsClientTimeout = 60 * time.Second
)

var (
	dsPingSizes   = []int{1, 64, 1024, 4096}
	dsStreamSizes = []int{64, 1024, 16 << 10, 64 << 10, 1 << 20}
)

// dsRow is one measurement of one client run.
type dsRow struct {
	Kind  string  `json:"kind"` // "pingpong" or "stream"
	Size  int     `json:"size"`
	P50us float64 `json:"p50_us,omitempty"` // full round trip
	P99us float64 `json:"p99_us,omitempty"`
	MBps  float64 `json:"mb_s,omitempty"`
	N     int     `json:"n"` // round trips or bytes
}

type dsResult struct {
	Err   string       `json:"err,omitempty"`
	Mode  string       `json:"mode,omitempty"`
	Rows  []dsRow      `json:"rows,omitempty"`
	Stats *extds.Stats `json:"stats,omitempty"`
}

func init() {
	if role := os.Getenv(dsRoleEnv); role != "" {
		os.Exit(dsHelper(role))
	}
}

// dsHelper runs a helper role and returns the exit status.
func dsHelper(role string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if dir := os.Getenv(dsProfEnv); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.prof", role, os.Getpid())))
		if err != nil {
			fmt.Fprintf(os.Stderr, "cpu profile: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "cpu profile: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	var dev *extds.Device
	if ctl := os.Getenv(dsCtlEnv); ctl != "" {
		var opts []extds.Option
		if n, err := strconv.Atoi(os.Getenv(dsRingEnv)); err == nil && n > 0 {
			opts = append(opts, extds.WithRingSize(n))
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := extds.AttachDevice(actx, ctl, opts...)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "attach: %v\n", err)
			return 1
		}
		dev = d
		defer dev.Close()
	}
	switch role {
	case "server":
		return dsServer(ctx, dev)
	case "client":
		res := dsClient(ctx, dev)
		if dev != nil {
			st := dev.Stats()
			res.Stats = &st
		}
		b, _ := json.Marshal(res)
		fmt.Println(dsResultPf + string(b))
		return 0
	}
	fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
	return 1
}

// dsServer listens for EXT-DS (with a Device) and for plain TCP, prints
// both ports and serves until SIGTERM.
func dsServer(ctx context.Context, dev *extds.Device) int {
	var lns []net.Listener
	dsPort := 0
	if dev != nil {
		ln, err := extds.Listen(dev, "tcp", ":0")
		if err != nil {
			fmt.Fprintf(os.Stderr, "listen extds: %v\n", err)
			return 1
		}
		lns = append(lns, ln)
		dsPort = ln.Addr().(*net.TCPAddr).Port
	}
	tln, err := net.Listen("tcp", ":0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "listen tcp: %v\n", err)
		return 1
	}
	lns = append(lns, tln)
	fmt.Printf("%s%d %d\n", dsListenPf, dsPort, tln.Addr().(*net.TCPAddr).Port)
	for _, l := range lns {
		go testenv.AcceptLoop(l, func(c net.Conn) { testenv.ServeKinds(c, dsKindPing, dsServe) })
	}
	<-ctx.Done()
	for _, l := range lns {
		l.Close()
	}
	return 0
}

// dsServe serves the kinds other than dsKindPing (testenv.ServeKinds).
func dsServe(c net.Conn, kind byte) {
	if kind != dsKindStream {
		return
	}
	var n int64
	var err error
	var sink io.Writer = io.Discard
	if os.Getenv(dsHashEnv) == "1" {
		sink = sha256.New()
	}
	if os.Getenv(dsCopyEnv) == "1" {
		n, err = io.Copy(sink, c)
	} else {
		buf := make([]byte, dsReadBuf)
		for {
			k, e := c.Read(buf)
			sink.Write(buf[:k])
			n += int64(k)
			if e != nil {
				if e != io.EOF {
					err = e
				}
				break
			}
		}
	}
	if err != nil {
		return
	}
	var ack [8]byte
	binary.LittleEndian.PutUint64(ack[:], uint64(n))
	c.Write(ack[:])
}

func dsClient(ctx context.Context, dev *extds.Device) (res dsResult) {
	addr, path := os.Getenv(dsAddrEnv), os.Getenv(dsPathEnv)
	dial := func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if path != "extds" {
			var d net.Dialer
			return d.DialContext(dctx, "tcp", addr)
		}
		if dev == nil {
			return nil, errors.New("extds path without a device")
		}
		c, err := extds.DialContext(dctx, dev, "tcp", addr)
		if err != nil {
			return nil, err
		}
		if c.Mode() != extds.ModeEXTDS {
			r, _ := c.FallbackReason()
			c.Close()
			return nil, fmt.Errorf("connection fell back to TCP (%v)", r)
		}
		return c, nil
	}
	res.Mode = path
	for _, m := range []struct {
		name  string
		sizes []int
		run   func(dial func() (net.Conn, error), size int) (dsRow, error)
	}{{"ping", dsPingSizes, dsPing}, {"stream", dsStreamSizes, dsStream}} {
		for _, size := range m.sizes {
			r, err := m.run(dial, size)
			if err != nil {
				res.Err = fmt.Sprintf("%s %d B: %v", m.name, size, err)
				return res
			}
			res.Rows = append(res.Rows, r)
		}
	}
	return res
}

func dsPing(dial func() (net.Conn, error), size int) (dsRow, error) {
	c, err := dial()
	if err != nil {
		return dsRow{}, err
	}
	defer c.Close()
	if err := testenv.OpenSized(c, dsKindPing, size); err != nil {
		return dsRow{}, err
	}
	buf := make([]byte, size)
	rtts := make([]time.Duration, 0, dsPingIters)
	end := time.Now().Add(dsPingTime)
	for i := 0; i < dsPingWarm+dsPingIters; i++ {
		t0 := time.Now()
		if t0.After(end) && len(rtts) > 0 {
			break
		}
		if _, err := c.Write(buf); err != nil {
			return dsRow{}, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return dsRow{}, err
		}
		if i >= dsPingWarm {
			rtts = append(rtts, time.Since(t0))
		}
	}
	if len(rtts) == 0 {
		return dsRow{}, errors.New("no round trip within the time limit")
	}
	slices.Sort(rtts)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return dsRow{Kind: "pingpong", Size: size, P50us: us(rtts[len(rtts)/2]), P99us: us(rtts[len(rtts)*99/100]), N: len(rtts)}, nil
}

func dsStream(dial func() (net.Conn, error), size int) (dsRow, error) {
	c, err := dial()
	if err != nil {
		return dsRow{}, err
	}
	defer c.Close()
	total := dsStreamBytes
	if size < 1024 {
		total = dsStreamSmallBytes
	}
	buf := make([]byte, size)
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := c.Write([]byte{dsKindStream}); err != nil {
		return dsRow{}, err
	}
	t0 := time.Now()
	end := t0.Add(dsStreamTime)
	sent := 0
	if os.Getenv(dsCopyEnv) == "1" {
		// io.Copy from a bounded reader: the sender's ReadFrom, if any.
		n, err := io.Copy(c, &dsSource{buf: buf, left: total, end: end})
		if err != nil {
			return dsRow{}, err
		}
		sent = int(n)
	} else {
		for i := 0; sent < total; i++ {
			if i%dsClockEvery == 0 && i > 0 && time.Now().After(end) {
				break
			}
			if _, err := c.Write(buf); err != nil {
				return dsRow{}, err
			}
			sent += size
		}
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return dsRow{}, err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return dsRow{}, err
	}
	el := time.Since(t0)
	if got := binary.LittleEndian.Uint64(ack[:]); got != uint64(sent) {
		return dsRow{}, fmt.Errorf("server received %d of %d bytes", got, sent)
	}
	return dsRow{Kind: "stream", Size: size, MBps: float64(sent) / el.Seconds() / 1e6, N: sent}, nil
}

// dsSource yields buf over and over (at most len(buf) bytes per Read),
// left bytes in all, and stops at end.
type dsSource struct {
	buf  []byte
	left int
	end  time.Time
	n    int
}

func (s *dsSource) Read(p []byte) (int, error) {
	if s.left <= 0 {
		return 0, io.EOF
	}
	if s.n++; s.n%dsClockEvery == 0 && time.Now().After(s.end) {
		return 0, io.EOF
	}
	// One write's worth per Read, like the Write loop's writes.
	k := copy(p[:min(len(p), s.left)], s.buf)
	s.left -= k
	return k, nil
}

// BenchmarkExtDS runs the comparison described at the top of this file.
// One run owns the measurement; use -benchtime 1x (perf/extds.sh does):
//
//	go test -run '^$' -bench ExtDS -benchtime 1x -timeout 10m ./perf/
func BenchmarkExtDS(b *testing.B) {
	testenv.RequirePrivileged(b, "ip")
	reps := perfReps()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}

	p := newPair(b, 12, 11)
	va, vb, vethB, n1, n2 := p.va, p.vb, p.vethB, p.n1, p.n2

	copyEnv := dsCopyEnv + "=" + os.Getenv(dsCopyEnv)
	hashEnv := dsHashEnv + "=" + os.Getenv(dsHashEnv)
	startServer := func(ns *nstest.Netns, ctl string, extra ...string) (dsPort, tcpPort string) {
		p := ns.StartEnv(b, append([]string{dsRoleEnv + "=server", dsCtlEnv + "=" + ctl, copyEnv, hashEnv}, extra...), self)
		b.Cleanup(func() { // graceful first: the Device detaches
			_ = p.Stop(5 * time.Second)
		})
		var line string
		err := nstest.Eventually(10*time.Second, func() error {
			if p.Exited() {
				return fmt.Errorf("server exited: %s", p.Output())
			}
			for _, l := range strings.Split(p.Output(), "\n") {
				if rest, ok := strings.CutPrefix(l, dsListenPf); ok {
					line = rest
					return nil
				}
			}
			return errors.New("server not listening yet")
		})
		if err != nil {
			b.Fatal(err)
		}
		f := strings.Fields(line)
		return f[0], f[1]
	}
	dsPort, exnPort := startServer(n2.NS, n2.Control)
	_, vethPort := startServer(vb, "")

	type variant struct {
		name string
		ns   *nstest.Netns
		env  []string
	}
	variants := []variant{
		{"EXT-DS (shm, attached)", n1.NS, []string{dsPathEnv + "=extds", dsCtlEnv + "=" + n1.Control, dsAddrEnv + "=" + net.JoinHostPort(n2.IP.String(), dsPort)}},
		{"TCP exn0", n1.NS, []string{dsPathEnv + "=tcp", dsAddrEnv + "=" + net.JoinHostPort(n2.IP.String(), exnPort)}},
		{"TCP veth", va, []string{dsPathEnv + "=tcp", dsAddrEnv + "=" + net.JoinHostPort(vethB, vethPort)}},
	}
	if alt := strings.Fields(os.Getenv(dsAltEnv)); len(alt) > 0 {
		altPort, _ := startServer(n2.NS, n2.Control, alt...)
		variants = append(variants, variant{"EXT-DS alt", n1.NS, append([]string{dsPathEnv + "=extds", dsCtlEnv + "=" + n1.Control,
			dsAddrEnv + "=" + net.JoinHostPort(n2.IP.String(), altPort)}, alt...)})
	}
	// results[variant][rep]
	results := make([][]dsResult, len(variants))
	for rep := 0; rep < reps; rep++ {
		for vi, v := range variants {
			env := append([]string{dsRoleEnv + "=client", copyEnv}, v.env...)
			out, err := v.ns.RunEnv(dsClientTimeout, env, self)
			if err != nil {
				b.Fatalf("%s client: %v\n%s", v.name, err, out)
			}
			var r dsResult
			found := false
			for _, l := range strings.Split(out, "\n") {
				if rest, ok := strings.CutPrefix(l, dsResultPf); ok {
					if err := json.Unmarshal([]byte(rest), &r); err != nil {
						b.Fatalf("%s client: %v: %s", v.name, err, rest)
					}
					found = true
				}
			}
			if !found || r.Err != "" {
				b.Fatalf("%s client: %s\n%s", v.name, r.Err, out)
			}
			if r.Stats != nil {
				b.Logf("rep %d %s client stats: rma puts %d, ring-full fallbacks %d, credit waits %d, credit msgs %d",
					rep+1, v.name, r.Stats.RMAPuts, r.Stats.RingFullFallbacks, r.Stats.CreditWaits, r.Stats.CreditMsgs)
			}
			results[vi] = append(results[vi], r)
		}
	}
	report(b, "", dsTable(b, results, reps))
}

// dsTable builds the markdown table (medians, ratios vs exn0, bars, per-run
// values) and reports every median as a metric.
func dsTable(b *testing.B, results [][]dsResult, reps int) string {
	// values[variant][row][metric] per rep
	type metric struct {
		name, unit string
		get        func(dsRow) float64
		bar        string
		lowBetter  bool
		barLimit   float64
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d runs each, medians; %d CPUs; load %s; io.Copy %q, server hashes %q\n\n",
		reps, numCPU(), loadAvg(), os.Getenv(dsCopyEnv), os.Getenv(dsHashEnv))
	alt := len(results) > 3
	altHead := ""
	if alt {
		altHead = fmt.Sprintf(" EXT-DS alt (%s) | alt / EXT-DS | alt per run |", os.Getenv(dsAltEnv))
	}
	fmt.Fprintf(&sb, "| measurement | EXT-DS | TCP exn0 | TCP veth | EXT-DS / exn0 | bar | EXT-DS per run | exn0 per run |%s\n|---|---|---|---|---|---|---|---|%s\n",
		altHead, strings.Repeat("---|", strings.Count(altHead, "|")))
	rows := results[0][0].Rows
	for ri, row := range rows {
		var ms []metric
		if row.Kind == "pingpong" {
			ms = []metric{
				{fmt.Sprintf("ping-pong %s p50", dsSize(row.Size)), "us", func(r dsRow) float64 { return r.P50us }, "<= 0.5x", true, 0.5},
				{fmt.Sprintf("ping-pong %s p99", dsSize(row.Size)), "us", func(r dsRow) float64 { return r.P99us }, "", true, 0},
			}
		} else {
			ms = []metric{{fmt.Sprintf("stream %s writes", dsSize(row.Size)), "MB/s", func(r dsRow) float64 { return r.MBps }, ">= 1.0x", false, 1.0}}
		}
		for _, m := range ms {
			med := make([]float64, len(results))
			per := make([][]float64, len(results))
			for vi := range results {
				for _, res := range results[vi] {
					per[vi] = append(per[vi], m.get(res.Rows[ri]))
				}
				med[vi] = testenv.Median(per[vi])
			}
			ratio := med[0] / med[1]
			verdict := ""
			if m.bar != "" {
				ok := ratio >= m.barLimit
				if m.lowBetter {
					ok = ratio <= m.barLimit
				}
				verdict = m.bar + ": missed"
				if ok {
					verdict = m.bar + ": met"
				}
			}
			fmt.Fprintf(&sb, "| %s | %.1f %s | %.1f %s | %.1f %s | %.2fx | %s | %s | %s |", m.name,
				med[0], m.unit, med[1], m.unit, med[2], m.unit, ratio, verdict, dsJoin(per[0]), dsJoin(per[1]))
			if alt {
				fmt.Fprintf(&sb, " %.1f %s | %.2fx | %s |", med[3], m.unit, med[3]/med[0], dsJoin(per[3]))
			}
			sb.WriteString("\n")
			key := strings.NewReplacer(" ", "-", ",", "").Replace(m.name)
			b.ReportMetric(med[0], key+"-extds-"+m.unit)
			b.ReportMetric(med[1], key+"-exn0-"+m.unit)
			b.ReportMetric(med[2], key+"-veth-"+m.unit)
			b.ReportMetric(ratio, key+"-extds/exn0")
			if alt {
				b.ReportMetric(med[3]/med[0], key+"-alt/extds")
			}
		}
	}
	return sb.String()
}

func dsJoin(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strings.Join(s, " / ")
}

func dsSize(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
