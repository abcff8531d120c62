package check

// The shim's side of the control protocol (shim/ctlparse.c) against Go's:
// every message of the protocol encoded by exnd's real encoder
// (control.Server + the extds/shimsrv result types) is decoded by the C
// decoder to the same values, every request the C encoder writes is
// decoded by the Go server to the operation and arguments the protocol
// table names, and FuzzCtlParse feeds arbitrary lines to the C decoder
// (built with AddressSanitizer where gcc has it) and checks that whatever
// it accepts, Go's encoding/json decodes to the same values.

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exn-project/exn/control"
	"github.com/exn-project/exn/extds/shimsrv"
	"github.com/exn-project/exn/internal/testenv"
)

var (
	harnessBuilt testenv.Built
	harnessMu    sync.Mutex
	harnessIn    io.WriteCloser
	harnessOut   *bufio.Reader
	harnessCmd   *exec.Cmd
)

// harness builds shim/check/testdata/ctlharness.c (with ASan and UBSan
// if gcc can) once per test process.
func harness(t testing.TB) string {
	t.Helper()
	testenv.NeedGCC(t)
	return harnessBuilt.Path(t, func() (string, error) {
		bin := filepath.Join(binDir, "ctlharness")
		return bin, testenv.CCSanitized("-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I", testenv.ModulePath("shim"), "-o", bin,
			testenv.ModulePath("shim", "check", "testdata", "ctlharness.c"))
	})
}

// cParse decodes line with the C decoder, through one long-running
// harness process per test process.
func cParse(t testing.TB, line []byte) string {
	t.Helper()
	bin := harness(t)
	harnessMu.Lock()
	defer harnessMu.Unlock()
	if harnessCmd == nil {
		cmd := exec.Command(bin, "parse")
		in, out := testenv.Pipes(t, cmd)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		harnessCmd, harnessIn, harnessOut = cmd, in, bufio.NewReader(out)
	}
	var h [4]byte
	binary.LittleEndian.PutUint32(h[:], uint32(len(line)))
	_, err1 := harnessIn.Write(h[:])
	_, err2 := harnessIn.Write(line)
	res, err3 := harnessOut.ReadString('\n')
	if err1 != nil || err2 != nil || err3 != nil {
		harnessCmd = nil
		t.Fatalf("C decoder died on %q: %v %v %v", line, err1, err2, err3)
	}
	return strings.TrimSuffix(res, "\n")
}

// decoded is what a response line means to the shim.
type decoded struct {
	OK                bool
	Mode              int // 0 none, 1 tcp, 2 extds, 3 other, 4 direct
	Version, Port, ID uint64
	Side, Ring, Hold  uint64
	HoldEnd           uint64
	Reason            string
	ReasonPlain       bool
}

func parseC(s string) (decoded, bool) {
	if s == "ERR" {
		return decoded{}, false
	}
	var d decoded
	var ok, plain int
	f := strings.SplitN(s, " reason=", 2)
	if _, err := fmt.Sscanf(f[0], "OK ok=%d mode=%d version=%d port=%d id=%d side=%d ring=%d hold=%d end=%d plain=%d", &ok, &d.Mode, &d.Version, &d.Port, &d.ID, &d.Side, &d.Ring, &d.Hold, &d.HoldEnd, &plain); err != nil || len(f) != 2 {
		panic(fmt.Sprintf("harness line %q: %v", s, err))
	}
	d.OK, d.ReasonPlain, d.Reason = ok == 1, plain == 1, f[1]
	return d, true
}

// goDecode is what the Go client (control.Client) makes of a line.
func goDecode(line []byte) (decoded, error) {
	var resp control.Response
	if err := json.Unmarshal(line, &resp); err != nil {
		return decoded{}, err
	}
	d := decoded{OK: resp.OK}
	if !resp.OK || len(resp.Data) == 0 {
		return d, nil
	}
	var v struct {
		Version uint64 `json:"version"`
		Port    uint64 `json:"port"`
		ID      uint64 `json:"id"`
		Mode    string `json:"mode"`
		Reason  string `json:"reason"`
		Side    uint64 `json:"side"`
		Ring    uint64 `json:"ring"`
		Hold    uint64 `json:"hold_ms"`
		HoldEnd uint64 `json:"hold_end"`
	}
	if err := json.Unmarshal(resp.Data, &v); err != nil {
		return decoded{}, err
	}
	d.Version, d.Port, d.ID, d.Reason, d.Side, d.Ring, d.Hold, d.HoldEnd = v.Version, v.Port, v.ID, v.Reason, v.Side, v.Ring, v.Hold, v.HoldEnd
	switch v.Mode {
	case "":
	case "tcp":
		d.Mode = 1
	case "extds":
		d.Mode = 2
	case "direct":
		d.Mode = 4
	default:
		d.Mode = 3
	}
	return d, nil
}

// directResult is the data of a "direct" answer to shim-connect /
// shim-accept (docs/direct.md, "What the program gets"), keys in that
// order; exnd's type lives with its shim server.
type directResult struct {
	Mode string `json:"mode"`
	ID   uint64 `json:"id"`
	Side int    `json:"side"`
	Ring uint64 `json:"ring"`
}

// protoResponse is one response of the protocol table (docs/shim.md).
type protoResponse struct {
	op   string
	v    any   // data, or nil with err
	err  error // an ok:false response
	want decoded
	// notDoc: an edge value, not an example line of docs/shim.md's table.
	notDoc bool
}

var fallbackReasons = []string{"no_route", "no_listener", "cached", "peer_no_fabric", "plain_client", "no_claim", "declined", "not_owner", "short_lived"}

func protoResponses() []protoResponse {
	rs := []protoResponse{
		{op: "shim-hello", v: shimsrv.HelloResult{Version: shimsrv.Version}, want: decoded{OK: true, Version: shimsrv.Version, ReasonPlain: true}},
		{op: "shim-listen", v: shimsrv.ListenResult{Port: 8080}, want: decoded{OK: true, Port: 8080, ReasonPlain: true}},
		{op: "shim-listen", v: shimsrv.ListenResult{Port: 65535}, want: decoded{OK: true, Port: 65535, ReasonPlain: true}, notDoc: true},
		{op: "shim-unlisten", v: struct{}{}, want: decoded{OK: true, ReasonPlain: true}},
		{op: "shim-connect", v: shimsrv.SwitchResult{Mode: "extds", ID: 1}, want: decoded{OK: true, Mode: 2, ID: 1, ReasonPlain: true}},
		{op: "shim-accept", v: shimsrv.SwitchResult{Mode: "extds", ID: math.MaxUint64}, want: decoded{OK: true, Mode: 2, ID: math.MaxUint64, ReasonPlain: true}, notDoc: true},
		{op: "shim-connect", v: directResult{Mode: "direct", ID: 5, Side: 0, Ring: 1 << 20},
			want: decoded{OK: true, Mode: 4, ID: 5, Ring: 1 << 20, ReasonPlain: true}},
		{op: "shim-accept", v: directResult{Mode: "direct", ID: math.MaxUint64, Side: 1, Ring: 64 << 20},
			want: decoded{OK: true, Mode: 4, ID: math.MaxUint64, Side: 1, Ring: 64 << 20, ReasonPlain: true}, notDoc: true},
		{op: "shim-hello", err: fmt.Errorf(`shim-hello: version "1" not supported (this exnd speaks 3)`), want: decoded{ReasonPlain: true}},
		{op: "shim-connect", err: fmt.Errorf("shim-connect: <tag> & \\ \"é\"\t"), want: decoded{ReasonPlain: true}},
	}
	rs = append(rs, protoResponse{op: "shim-accept", v: shimsrv.SwitchResult{Mode: "tcp", Reason: "short_lived", HoldMS: 990, HoldEnd: 52718003900000},
		want: decoded{OK: true, Mode: 1, Reason: "short_lived", Hold: 990, HoldEnd: 52718003900000, ReasonPlain: true}})
	rs = append(rs, protoResponse{op: "shim-connect", v: shimsrv.SwitchResult{Mode: "tcp", Reason: "short_lived", HoldMS: 2032, HoldEnd: math.MaxUint64},
		want: decoded{OK: true, Mode: 1, Reason: "short_lived", Hold: 2032, HoldEnd: math.MaxUint64, ReasonPlain: true}, notDoc: true})
	for _, r := range fallbackReasons {
		rs = append(rs, protoResponse{op: "shim-connect", v: shimsrv.SwitchResult{Mode: "tcp", Reason: r},
			want: decoded{OK: true, Mode: 1, Reason: r, ReasonPlain: true}})
	}
	return rs
}

// encodeGo returns the response lines exnd's control server writes for rs
// (its real encoder, over a socketpair).
func encodeGo(t *testing.T, rs []protoResponse) [][]byte {
	t.Helper()
	s := control.NewServer(nil)
	for i, r := range rs {
		s.Handle("t"+strconv.Itoa(i), func(context.Context, []string) (any, error) { return r.v, r.err })
	}
	ac, bc := testenv.UnixPair(t)
	done := testenv.Go(func() { s.ServeConn(context.Background(), ac) })
	defer func() {
		bc.Close()
		<-done
		s.Close()
	}()
	rd := bufio.NewReader(bc)
	lines := make([][]byte, len(rs))
	for i := range rs {
		if _, err := fmt.Fprintf(bc, "t%d\n", i); err != nil {
			t.Fatal(err)
		}
		l, err := rd.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		lines[i] = l[:len(l)-1]
	}
	return lines
}

// TestCtlResponses: every response exnd writes decodes the same in C and
// in Go, and is the line docs/shim.md's protocol table shows.
func TestCtlResponses(t *testing.T) {
	rs := protoResponses()
	lines := encodeGo(t, rs)
	doc := shimDoc(t)
	for i, r := range rs {
		line := lines[i]
		got, ok := parseC(cParse(t, line))
		if !ok || got != r.want {
			t.Errorf("%s %q: C decoded %+v (accepted %v), want %+v", r.op, line, got, ok, r.want)
		}
		w := r.want
		w.ReasonPlain = false // a C-side flag
		if g, err := goDecode(line); err != nil || g != w {
			t.Errorf("%s %q: Go decoded %+v, %v, want %+v", r.op, line, g, err, w)
		}
		if r.err == nil && !r.notDoc && !strings.Contains(string(doc), "`"+string(line)+"`") {
			t.Errorf("%s: response %s is not in docs/shim.md's protocol table", r.op, line)
		}
	}
}

// TestCtlRequests: every request the C encoder writes is the line of the
// protocol table, and exnd's control server decodes it to that operation
// and those arguments.
func TestCtlRequests(t *testing.T) {
	bin := harness(t)
	doc := shimDoc(t)
	out, err := exec.Command(bin, "req").Output()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{ // "op arg" of ctlharness → the line
		"0 0": "shim-hello 5", "1 0": "shim-listen", "2 1": "shim-unlisten 1", "2 8080": "shim-unlisten 8080",
		"2 65535": "shim-unlisten 65535", "2 0": "ERR", "2 65536": "ERR", "3 0": "shim-connect", "4 0": "shim-accept", "3 1": "shim-connect direct", "4 1": "shim-accept direct", "3 2": "shim-connect fd_limit", "4 2": "shim-accept fd_limit", "3 3": "shim-connect upgrade", "4 3": "shim-accept upgrade", "3 4": "ERR", "5 0": "shim-relay", "99 0": "ERR",
	}
	type call struct {
		op   string
		args []string
	}
	var mu sync.Mutex
	var calls []call
	s := control.NewServer(nil)
	for _, op := range []string{"shim-hello", "shim-listen", "shim-unlisten", "shim-connect", "shim-accept", "shim-relay"} {
		s.Handle(op, func(_ context.Context, args []string) (any, error) {
			mu.Lock()
			calls = append(calls, call{op, args})
			mu.Unlock()
			return struct{}{}, nil
		})
	}
	defer s.Close()
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("harness wrote %d requests, want %d: %q", len(lines), len(want), out)
	}
	for _, l := range lines {
		f := strings.SplitN(l, " ", 3)
		key, line := f[0]+" "+f[1], f[2]
		if want[key] != line {
			t.Errorf("C encoded %s as %q, want %q", key, line, want[key])
			continue
		}
		if line == "ERR" {
			continue
		}
		if !strings.Contains(string(doc), "`"+line+"`") && key != "2 1" && key != "2 65535" {
			t.Errorf("request %q is not in docs/shim.md's protocol table", line)
		}
		calls = nil
		c1, c2 := net.Pipe()
		done := testenv.Go(func() { s.ServeConn(context.Background(), c1) })
		_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c2.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := bufio.NewReader(c2).ReadString('\n')
		c2.Close()
		<-done
		fields := strings.Fields(line)
		if err != nil || !strings.HasPrefix(resp, `{"ok":true`) || len(calls) != 1 || calls[0].op != fields[0] ||
			strings.Join(calls[0].args, " ") != strings.Join(fields[1:], " ") {
			t.Errorf("Go decoded %q as %+v (response %q, %v)", line, calls, resp, err)
		}
	}
}

// FuzzCtlParse: the C decoder never crashes or reads out of bounds (ASan),
// and whatever it accepts, Go decodes to the same values.
func FuzzCtlParse(f *testing.F) {
	for _, s := range []string{
		`{"ok":true,"data":{"version":2}}`, `{"ok":true,"data":{"mode":"extds","id":7}}`, `{"ok":true,"data":{"mode":"direct","id":7,"side":1,"ring":4096}}`,
		`{"ok":true,"data":{"mode":"tcp","reason":"no_claim"}}`, `{"ok":false,"error":"x \"y\" \u003c"}`,
		`{"ok":true,"data":{"port":80}}`, `{"ok":true,"data":{}}`, `{"ok":true}`, `{"ok":true,"data":null}`,
		`{"ok":true,"data":{"mode":"extds","id":1},"data":{"mode":"tcp"}}`, `{"OK":true}`, `{"ok":true,"data":{"ID":5}}`,
		`{"ok":true,"data":{"x":[1,{"y":-1.5e3}],"id":18446744073709551615}}`, `{"ok":true,"data":{"id":18446744073709551616}}`,
		`{"ok":true,"data":{"mode":"ext\u0064s"}}`, `{"ok":true} x`, ` {"ok" : true , "data" : { "id" : 3 } } `,
		"{\"ok\":true,\"data\":{\"reason\":\"\xff\"}}", `{"ok":null}`, `{"ok":"true"}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		got, ok := parseC(cParse(t, line))
		if !ok {
			return // C may be stricter than Go
		}
		g, err := goDecode(line)
		if err != nil {
			t.Fatalf("C accepted %q as %+v; Go: %v", line, got, err)
		}
		if !got.ReasonPlain {
			got.Reason, g.Reason = "", "" // C does not unescape: compared only when plain
		}
		got.ReasonPlain, g.ReasonPlain = false, false
		if !g.OK && !got.OK {
			return // a refusal both ways: the shim reads nothing else
		}
		if got != g {
			t.Fatalf("%q: C decoded %+v, Go %+v", line, got, g)
		}
	})
}

// shimDoc returns docs/shim.md, whose protocol table the control lines
// must stand in.
func shimDoc(t *testing.T) []byte {
	t.Helper()
	doc, err := os.ReadFile(testenv.ModulePath("docs", "shim.md"))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}
