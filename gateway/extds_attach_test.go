package gateway

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds"
	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/backend"
	"github.com/exn-project/exn/fabric/mem"
	"github.com/exn-project/exn/internal/testenv"
	"github.com/exn-project/exn/tap/taptest"
)

// The application processes of the attach tests are this test binary,
// re-executed with appRoleEnv set (see TestAttachAppHelper).
const (
	appRoleEnv    = "EXN_ATTACH_APP_ROLE"
	appControlEnv = "EXN_ATTACH_APP_CONTROL"
	appAddrEnv    = "EXN_ATTACH_APP_ADDR"
	appBytesEnv   = "EXN_ATTACH_APP_BYTES"
	appBenchEnv   = "EXN_ATTACH_APP_BENCH"
)

// Connection kinds, the first byte a client sends.
const (
	kindSHA    = 'S' // u64 length, data; the server answers the sha256 (hex)
	kindPing   = 'P' // u32 size, then size-byte messages echoed until EOF
	kindStream = 'T' // u64 length, data; the server answers one byte
)

// appResult is what an app process reports on its last stdout line.
type appResult struct {
	Err      string        `json:"err,omitempty"`
	Mode     string        `json:"mode,omitempty"`
	Peer     string        `json:"peer,omitempty"`
	SHA      string        `json:"sha,omitempty"`
	WantSHA  string        `json:"want_sha,omitempty"`
	Stats    extds.Stats   `json:"stats"`
	Bench    []benchRow    `json:"bench,omitempty"`
	VPIDBase fabric.VPID   `json:"vpid_base"`
	Node     fabric.NodeID `json:"node"`
}

type benchRow struct {
	Kind  string  `json:"kind"` // "pingpong" or "stream"
	Path  string  `json:"path"` // "extds" or "tcp-lo"
	Size  int     `json:"size"`
	P50us float64 `json:"p50_us,omitempty"`
	P99us float64 `json:"p99_us,omitempty"`
	MBps  float64 `json:"mb_s,omitempty"`
}

func TestAttachAppHelper(t *testing.T) {
	role := os.Getenv(appRoleEnv)
	if role == "" {
		t.Skip("helper process for the attach tests")
	}
	res := runApp(role)
	b, _ := json.Marshal(res)
	fmt.Println("RESULT " + string(b))
	os.Exit(0)
}

func runApp(role string) (res appResult) {
	ctx, cancel := context.WithTimeout(context.Background(), 80*time.Second)
	defer cancel()
	dev, err := extds.AttachDevice(ctx, os.Getenv(appControlEnv))
	if err != nil {
		return appResult{Err: "attach: " + err.Error()}
	}
	defer func() {
		res.Stats = dev.Stats()
		res.Node = dev.Node()
		res.VPIDBase = dev.VPID(0)
		if err := dev.Close(); err != nil && res.Err == "" {
			res.Err = "close: " + err.Error()
		}
	}()
	switch role {
	case "server":
		ln, err := extds.Listen(dev, "tcp", os.Getenv(appAddrEnv))
		if err != nil {
			return appResult{Err: "listen: " + err.Error()}
		}
		tln, err := net.Listen("tcp", "127.0.0.1:0") // the TCP baseline
		if err != nil {
			return appResult{Err: "listen tcp: " + err.Error()}
		}
		fmt.Println("LISTEN", ln.Addr(), tln.Addr())
		for _, l := range []net.Listener{ln, tln} {
			go testenv.AcceptLoop(l, func(c net.Conn) { testenv.ServeKinds(c, kindPing, serveApp) })
		}
		io.Copy(io.Discard, os.Stdin) // until the parent closes it
		ln.Close()
		tln.Close()
		return appResult{}
	case "client":
		addrs := strings.Fields(os.Getenv(appAddrEnv))
		n, _ := strconv.Atoi(os.Getenv(appBytesEnv))
		c, err := extds.DialContext(ctx, dev, "tcp", addrs[0])
		if err != nil {
			return appResult{Err: "dial: " + err.Error()}
		}
		res.Mode = c.Mode().String()
		if p, ok := c.FabricPeer(); ok {
			res.Peer = p.String()
		}
		data := make([]byte, n)
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		want := sha256.Sum256(data)
		res.WantSHA = hex.EncodeToString(want[:])
		var hdr [9]byte
		hdr[0] = kindSHA
		binary.LittleEndian.PutUint64(hdr[1:], uint64(n))
		if _, err := c.Write(hdr[:]); err != nil {
			res.Err = "write: " + err.Error()
			return res
		}
		chunks := []int{100, 480, 1000, 70000, 256 << 10} // eager and RMA writes
		for off, i := 0, 0; off < n; i++ {
			end := min(off+chunks[i%len(chunks)], n)
			if _, err := c.Write(data[off:end]); err != nil {
				res.Err = "write: " + err.Error()
				return res
			}
			off = end
		}
		var sum [64]byte
		if _, err := io.ReadFull(c, sum[:]); err != nil {
			res.Err = "read sha: " + err.Error()
			return res
		}
		res.SHA = string(sum[:])
		c.Close()
		if os.Getenv(appBenchEnv) != "" {
			for _, a := range []struct{ path, addr string }{{"extds", addrs[0]}, {"tcp-lo", addrs[1]}} {
				rows, err := runBench(ctx, dev, a.path, a.addr)
				if err != nil {
					res.Err = "bench " + a.path + ": " + err.Error()
					return res
				}
				res.Bench = append(res.Bench, rows...)
			}
		}
		return res
	}
	return appResult{Err: "unknown role " + role}
}

// serveApp serves the kinds other than kindPing (testenv.ServeKinds).
func serveApp(c net.Conn, kind byte) {
	if kind != kindSHA && kind != kindStream {
		return
	}
	var l [8]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return
	}
	h := sha256.New()
	if _, err := io.CopyN(h, c, int64(binary.LittleEndian.Uint64(l[:]))); err != nil {
		return
	}
	if kind == kindStream {
		c.Write([]byte{1})
		return
	}
	c.Write([]byte(hex.EncodeToString(h.Sum(nil))))
}

// runBench measures ping-pong (1 B..4 KiB) and streaming (64 B..1 MiB
// writes) over one path.
func runBench(ctx context.Context, dev *extds.Device, path, addr string) ([]benchRow, error) {
	dial := func() (net.Conn, error) {
		if path == "tcp-lo" {
			return net.Dial("tcp", addr)
		}
		c, err := extds.DialContext(ctx, dev, "tcp", addr)
		if err == nil && c.Mode() != extds.ModeEXTDS {
			c.Close()
			return nil, fmt.Errorf("connection fell back to TCP")
		}
		return c, err
	}
	var rows []benchRow
	for _, size := range []int{1, 64, 1024, 4096} {
		c, err := dial()
		if err != nil {
			return nil, err
		}
		testenv.OpenSized(c, kindPing, size)
		buf := make([]byte, size)
		const iters = 5000
		rtts := make([]time.Duration, 0, iters)
		for i := 0; i < iters+500; i++ {
			t0 := time.Now()
			if _, err := c.Write(buf); err != nil {
				return nil, err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return nil, err
			}
			if i >= 500 { // warm-up
				rtts = append(rtts, time.Since(t0))
			}
		}
		c.Close()
		slices.Sort(rtts)
		rows = append(rows, benchRow{Kind: "pingpong", Path: path, Size: size,
			P50us: float64(rtts[len(rtts)/2].Nanoseconds()) / 1e3, P99us: float64(rtts[len(rtts)*99/100].Nanoseconds()) / 1e3})
	}
	for _, size := range []int{64, 1024, 16 << 10, 64 << 10, 1 << 20} {
		c, err := dial()
		if err != nil {
			return nil, err
		}
		total := 256 << 20
		if size < 1024 {
			total = 16 << 20
		}
		var hdr [9]byte
		hdr[0] = kindStream
		binary.LittleEndian.PutUint64(hdr[1:], uint64(total))
		c.Write(hdr[:])
		buf := make([]byte, size)
		t0 := time.Now()
		for sent := 0; sent < total; sent += size {
			if _, err := c.Write(buf); err != nil {
				return nil, err
			}
		}
		var ack [1]byte
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			return nil, err
		}
		el := time.Since(t0)
		c.Close()
		rows = append(rows, benchRow{Kind: "stream", Path: path, Size: size, MBps: float64(total) / el.Seconds() / 1e6})
	}
	return rows, nil
}

// shmNode starts exnd node id on shm fabric fab with a taptest device.
func shmNode(t *testing.T, fab string, id fabric.NodeID, peersFile string) *testNode {
	t.Helper()
	cfg := Config{
		Node: id, Fabric: backend.Spec{Kind: backend.SHM, Arg: fab}, Ifname: "exnt", MTU: DefaultMTU,
		EagerThreshold: DefaultEagerThreshold, Control: filepath.Join(t.TempDir(), "exnd.sock"), Peers: peersFile,
	}
	dev := taptest.New(cfg.Ifname, cfg.MTU)
	d, err := Start(cfg, slog.New(slog.DiscardHandler), WithDevice(dev))
	if err != nil {
		t.Fatalf("start node %d: %v", id, err)
	}
	n := &testNode{d: d, dev: dev, cfg: cfg}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close node %d: %v", id, err)
		}
	})
	return n
}

type appProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	lines chan string
}

func startApp(t *testing.T, role, ctl, addr string, env ...string) *appProc {
	t.Helper()
	cmd, stdin, stdout := testenv.StartPipedHelper(t, "TestAttachAppHelper", append([]string{appRoleEnv + "=" + role, appControlEnv + "=" + ctl, appAddrEnv + "=" + addr}, env...)...)
	p := &appProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	return p
}

// line returns the app's next stdout line with prefix.
func (p *appProc) line(t *testing.T, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case s, ok := <-p.lines:
			if !ok {
				t.Fatalf("app exited before printing %q", prefix)
			}
			if rest, ok := strings.CutPrefix(s, prefix); ok {
				return strings.TrimSpace(rest)
			}
		case <-deadline:
			t.Fatalf("app printed no %q line in %v", prefix, within)
		}
	}
}

func (p *appProc) result(t *testing.T, within time.Duration) appResult {
	t.Helper()
	var r appResult
	if err := json.Unmarshal([]byte(p.line(t, "RESULT ", within)), &r); err != nil {
		t.Fatal(err)
	}
	if r.Err != "" {
		t.Fatalf("app: %s", r.Err)
	}
	return r
}

func nodeStats(t *testing.T, c *control.Client) map[string]map[string]json.RawMessage {
	t.Helper()
	var st map[string]map[string]json.RawMessage
	call(t, c, &st, "stats")
	return st
}

func statNum(t *testing.T, st map[string]map[string]json.RawMessage, part, key string) uint64 {
	t.Helper()
	v, ok := st[part][key]
	if !ok {
		t.Fatalf("stats.%s has no %s", part, key)
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	if err != nil {
		t.Fatalf("stats.%s.%s = %s", part, key, v)
	}
	return n
}

func shmFiles(t *testing.T, fab string) []string {
	m, _ := filepath.Glob(filepath.Join("/dev/shm", "exn-"+fab+"-*"))
	return m
}

// TestAttachEndToEnd: two exnd nodes on shm (taptest devices, no root),
// one application process on each attached through extds.AttachDevice.
// The client dials the server's EXT-DS listener (the probe goes through
// node 2's exnd, the shadow TCP over loopback), sends bytes checked by
// sha256; the apps' Device stats show the bytes, exnd's fabric counters
// show none of them (kernel bypass), and both leases are reclaimed when
// the apps exit. Bad control requests are refused and counted.
func TestAttachEndToEnd(t *testing.T) {
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	testenv.VerifyNoLeaks(t)
	fab := fmt.Sprintf("att%d", os.Getpid())
	t.Cleanup(func() {
		if left := shmFiles(t, fab); len(left) > 0 {
			for _, f := range left {
				os.Remove(f)
			}
			t.Errorf("files left in /dev/shm: %v", left)
		}
	})
	// The shadow TCP connections need an address the neighbour table
	// accepts (unicast, not loopback): this host's own, mapped to node 2
	// in node 1's table.
	hostIP := localIPv4(t)
	peers := filepath.Join(t.TempDir(), "peers")
	if err := os.WriteFile(peers, []byte("2 localhost "+hostIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n1 := shmNode(t, fab, 1, peers)
	n2 := shmNode(t, fab, 2, peers)
	c1, c2 := dial(t, n1.cfg.Control), dial(t, n2.cfg.Control)

	// Bad requests.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"extds-attach"}, {"extds-attach", "0"}, {"extds-attach", "x"}, {"extds-attach", strconv.Itoa(os.Getpid())},
		{"extds-attach", "2147483647"}, {"extds-detach", "1", "32"}, {"extds-listen", "1", "32", "80"},
		{"extds-unlisten", "1", "32", "80"}, {"extds-detach", "1"},
	} {
		if err := c1.Call(ctx, nil, args[0], args[1:]...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	var lr LeasesReply
	call(t, c1, &lr, "extds-leases")
	if lr.Stats.Refused != 9 || len(lr.Leases) != 0 || lr.Free != 14 {
		t.Fatalf("extds-leases after bad requests: %+v", lr)
	}

	size := 8 << 20
	if testenv.Small() {
		size = 1 << 20
	}
	bench := os.Getenv("EXN_ATTACH_BENCH") != ""
	srv := startApp(t, "server", n2.cfg.Control, net.JoinHostPort(hostIP, "0"))
	addrs := strings.Fields(srv.line(t, "LISTEN ", 20*time.Second))
	var env []string
	if bench {
		env = append(env, appBenchEnv+"=1")
	}
	cli := startApp(t, "client", n1.cfg.Control, strings.Join(addrs, " "), append(env, appBytesEnv+"="+strconv.Itoa(size))...)
	within := 60 * time.Second
	if bench {
		within = 10 * time.Minute
	}
	cr := cli.result(t, within)
	if cr.SHA != cr.WantSHA {
		t.Fatalf("sha256 mismatch: server %s, sent %s", cr.SHA, cr.WantSHA)
	}
	if cr.Mode != extds.ModeEXTDS.String() {
		t.Fatalf("client connection mode %q, want EXT-DS", cr.Mode)
	}
	call(t, c2, &lr, "extds-leases")
	if len(lr.Leases) != 1 || !lr.Leases[0].Attached || !slices.Contains(lr.Leases[0].Ports, portOf(t, addrs[0])) {
		t.Fatalf("node 2 leases %+v", lr)
	}
	srvBase := lr.Leases[0].VPIDBase
	if want := fmt.Sprintf("2:%d", int(srvBase)+int(portOf(t, addrs[0])&0xF)); cr.Peer != want {
		t.Fatalf("client's fabric peer %s, want %s (the server process's VPID)", cr.Peer, want)
	}
	srv.stdin.Close()
	sr := srv.result(t, 20*time.Second)
	if cr.Node != 1 || sr.Node != 2 || cr.VPIDBase < 32 || sr.VPIDBase < 32 {
		t.Fatalf("apps on %d (vpid %d) and %d (vpid %d)", cr.Node, cr.VPIDBase, sr.Node, sr.VPIDBase)
	}
	if tx := cr.Stats.TxVELOBytes + cr.Stats.TxRMABytes + cr.Stats.TxZCopyBytes; tx < uint64(size) || sr.Stats.RxBytes < uint64(size) {
		t.Fatalf("app stats: client sent %d, server received %d, want ≥ %d", tx, sr.Stats.RxBytes, size)
	}
	if cr.Stats.ConnsEXTDS == 0 || sr.Stats.ConnsEXTDS == 0 {
		t.Fatalf("no EXT-DS connection in the apps' stats: %+v / %+v", cr.Stats, sr.Stats)
	}
	// Kernel bypass: exnd's NICs moved none of the data. Node 2's exnd
	// answered the probe(s) (one VELO message each way), nothing more.
	for i, c := range []*control.Client{c1, c2} {
		st := nodeStats(t, c)
		rma := statNum(t, st, "fabric", "rma_bytes")
		velo := statNum(t, st, "fabric", "velo_sent_bytes") + statNum(t, st, "fabric", "velo_recv_bytes")
		if rma != 0 || velo > 4096 {
			t.Fatalf("node %d's exnd moved data: rma %d bytes, velo %d bytes", i+1, rma, velo)
		}
		if rx := statNum(t, st, "extds", "rx_bytes"); rx != 0 {
			t.Fatalf("node %d's exnd EXT-DS received %d bytes", i+1, rx)
		}
	}
	if st := nodeStats(t, c2); statNum(t, st, "extds", "probes_served") == 0 {
		t.Fatal("node 2's exnd served no probe")
	}
	if bench {
		printBench(t, cr.Bench)
	}
	// Both apps exited: their leases are reclaimed.
	cli.cmd.Wait()
	srv.cmd.Wait()
	for i, c := range []*control.Client{c1, c2} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			call(t, c, &lr, "extds-leases")
			if len(lr.Leases) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d still leases %+v", i+1, lr.Leases)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if lr.Stats.Attached != 1 || lr.Stats.Detached+lr.Stats.Reclaimed != 1 || lr.Fabric.Reclaimed != 1 {
			t.Fatalf("node %d attach stats %+v, fabric %+v", i+1, lr.Stats, lr.Fabric)
		}
	}
}

// localIPv4 returns a non-loopback IPv4 address of this host.
func localIPv4(t *testing.T) string {
	t.Helper()
	as, err := net.InterfaceAddrs()
	if err != nil {
		t.Skip(err)
	}
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Skip("no non-loopback IPv4 address on this host")
	return ""
}

func portOf(t *testing.T, addr string) uint16 {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return uint16(n)
}

func printBench(t *testing.T, rows []benchRow) {
	by := map[string]benchRow{}
	for _, r := range rows {
		by[fmt.Sprint(r.Kind, r.Path, r.Size)] = r
	}
	for _, r := range rows {
		if r.Path != "extds" {
			continue
		}
		tcp := by[fmt.Sprint(r.Kind, "tcp-lo", r.Size)]
		if r.Kind == "pingpong" {
			t.Logf("pingpong %6d B: extds p50 %7.1f µs p99 %7.1f µs | tcp-lo p50 %7.1f µs p99 %7.1f µs | p50 ratio %.2f",
				r.Size, r.P50us, r.P99us, tcp.P50us, tcp.P99us, r.P50us/tcp.P50us)
		} else {
			t.Logf("stream   %7d B writes: extds %8.0f MB/s | tcp-lo %8.0f MB/s | ratio %.2f", r.Size, r.MBps, tcp.MBps, r.MBps/tcp.MBps)
		}
	}
}

// TestAttachNeedsSHM: on the mem fabric extds-attach says why not.
func TestAttachNeedsSHM(t *testing.T) {
	testenv.VerifyNoLeaks(t)
	n := startNode(t, mem.NewCluster(), memConfig(t, 1))
	c := dial(t, n.cfg.Control)
	err := c.Call(t.Context(), nil, "extds-attach", strconv.Itoa(os.Getppid()))
	if err == nil || !strings.Contains(err.Error(), "kernel bypass needs the shm fabric") {
		t.Fatalf("extds-attach on mem: %v", err)
	}
	_, err = extds.AttachDevice(t.Context(), n.cfg.Control)
	if err == nil || !strings.Contains(err.Error(), "kernel bypass needs the shm fabric") {
		t.Fatalf("AttachDevice on mem: %v", err)
	}
}
