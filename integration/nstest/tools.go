package nstest

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Iperf3Result is what the tests read from iperf3 -J.
type Iperf3Result struct {
	// BitsPerSecond is the receiver's rate (sum_received for TCP, sum for
	// UDP as seen by the server).
	BitsPerSecond float64
	Bytes         float64
	LostPercent   float64 // UDP only
	Retransmits   int     // TCP only
}

type iperfJSON struct {
	End struct {
		SumReceived struct {
			Bytes         float64 `json:"bytes"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
		SumSent struct {
			Retransmits int `json:"retransmits"`
		} `json:"sum_sent"`
		Sum struct {
			Bytes         float64 `json:"bytes"`
			BitsPerSecond float64 `json:"bits_per_second"`
			LostPercent   float64 `json:"lost_percent"`
		} `json:"sum"`
	} `json:"end"`
	Error string `json:"error"`
}

var portSeq = 20000

// Port returns a fresh TCP/UDP port number for a server in a test.
func Port() int {
	regMu.Lock()
	defer regMu.Unlock()
	portSeq++
	return portSeq
}

// PortArg is Port as a command-line argument, the form every server and
// client the tests start takes it in.
func PortArg() string { return strconv.Itoa(Port()) }

// StartIperf3Server starts an unmodified iperf3 server for one test
// (-s -1) in ns, bound to ip on a fresh port, with the extra environment
// env (nil for none), and waits until it listens. It returns the server
// and its port.
func StartIperf3Server(t testing.TB, ns *Netns, env []string, ip string) (*Proc, string, error) {
	t.Helper()
	port := PortArg()
	s := ns.StartEnv(t, env, "iperf3", "-s", "-1", "-B", ip, "-p", port)
	return s, port, ns.WaitListening(s, port, 10*time.Second)
}

// Iperf3 runs an unmodified iperf3 server in srv (one test, -1) and the
// client in cli against ip, for secs seconds, with extra client args
// (e.g. "-u", "-b", "100M" or "-P", "2"). It retries the client while the
// server is not listening yet. Every process is bounded by a timeout.
func Iperf3(t testing.TB, srv, cli *Netns, ip string, secs int, extra ...string) (Iperf3Result, error) {
	t.Helper()
	return Iperf3Env(t, srv, cli, nil, nil, ip, secs, extra...)
}

// Iperf3Env is Iperf3 with extra environments for the server (srvEnv) and
// the client (cliEnv), such as the shim's LD_PRELOAD; nil for none.
func Iperf3Env(t testing.TB, srv, cli *Netns, srvEnv, cliEnv []string, ip string, secs int, extra ...string) (Iperf3Result, error) {
	t.Helper()
	s, port, err := StartIperf3Server(t, srv, srvEnv, ip)
	if err != nil {
		return Iperf3Result{}, err
	}
	args := append([]string{"iperf3", "-c", ip, "-p", port, "-t", strconv.Itoa(secs), "-J", "--connect-timeout", "2000"}, extra...)
	var out string
	for attempt := 0; attempt < 20; attempt++ {
		out, err = cli.RunEnv(time.Duration(secs)*time.Second+20*time.Second, cliEnv, args...)
		if !strings.Contains(out, "Connection refused") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = s.Wait(5 * time.Second)
	if err != nil {
		return Iperf3Result{}, fmt.Errorf("iperf3 %s: %w\nclient: %s\nserver: %s", ip, err, tail(out), tail(s.Output()))
	}
	var j iperfJSON
	if jerr := json.Unmarshal([]byte(out), &j); jerr != nil {
		return Iperf3Result{}, fmt.Errorf("iperf3 %s: parse json: %w: %s", ip, jerr, tail(out))
	}
	if j.Error != "" {
		return Iperf3Result{}, fmt.Errorf("iperf3 %s: %s", ip, j.Error)
	}
	r := Iperf3Result{BitsPerSecond: j.End.SumReceived.BitsPerSecond, Bytes: j.End.SumReceived.Bytes,
		Retransmits: j.End.SumSent.Retransmits}
	if r.BitsPerSecond == 0 { // UDP: end.sum is the server-side view
		r.BitsPerSecond, r.Bytes, r.LostPercent = j.End.Sum.BitsPerSecond, j.End.Sum.Bytes, j.End.Sum.LostPercent
	}
	if r.Bytes == 0 {
		return r, fmt.Errorf("iperf3 %s: no bytes received: %s", ip, tail(out))
	}
	return r, nil
}

// SockperfResult holds sockperf ping-pong latencies (half round trip,
// as sockperf reports them) in microseconds.
type SockperfResult struct {
	Avg, P50, P99 float64
	Observations  int
}

var (
	spAvg = regexp.MustCompile(`avg-latency=([0-9.]+)`)
	spP50 = regexp.MustCompile(`percentile 50\.000 =\s+([0-9.]+)`)
	spP99 = regexp.MustCompile(`percentile 99\.000 =\s+([0-9.]+)`)
	spObs = regexp.MustCompile(`#\s*(\d+) observations|(\d+) observations`)
)

// SockperfMPS is the --mps every sockperf client gets: without it
// sockperf sizes its sequence table for 600 000 messages a second, and a
// faster exchange (the shim's direct connections pass a million) aborts
// the run with "ERROR: _seqN > m_maxSequenceNo" (seen in TestShim's
// select and poll runs). Ten million a second never paces a real run.
const SockperfMPS = "10000000"

// Sockperf runs an unmodified sockperf TCP server in srv and a ping-pong
// client in cli for secs seconds.
func Sockperf(t testing.TB, srv, cli *Netns, ip string, secs int) (SockperfResult, error) {
	t.Helper()
	return SockperfEnv(t, srv, cli, nil, nil, ip, secs)
}

// SockperfEnv is Sockperf with extra environments for the server (srvEnv)
// and the client (cliEnv), nil for none, and extra client args (e.g.
// "-m", "64").
func SockperfEnv(t testing.TB, srv, cli *Netns, srvEnv, cliEnv []string, ip string, secs int, extra ...string) (SockperfResult, error) {
	t.Helper()
	port := PortArg()
	s := srv.StartEnv(t, srvEnv, "sockperf", "server", "--tcp", "-i", ip, "-p", port)
	defer func() { _ = s.Wait(0) }() // the server never exits on its own
	if err := srv.WaitListening(s, port, 10*time.Second); err != nil {
		return SockperfResult{}, err
	}
	args := append([]string{"sockperf", "ping-pong", "--tcp", "-i", ip, "-p", port, "-t", strconv.Itoa(secs), "--mps", SockperfMPS}, extra...)
	var (
		out string
		err error
	)
	for attempt := 0; attempt < 20; attempt++ {
		out, err = cli.RunEnv(time.Duration(secs)*time.Second+20*time.Second, cliEnv, args...)
		if err == nil && spP50.MatchString(out) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return SockperfResult{}, fmt.Errorf("sockperf %s: %w\nclient: %s\nserver: %s", ip, err, tail(out), tail(s.Output()))
	}
	var r SockperfResult
	for _, x := range []struct {
		re *regexp.Regexp
		v  *float64
	}{{spAvg, &r.Avg}, {spP50, &r.P50}, {spP99, &r.P99}} {
		m := x.re.FindStringSubmatch(out)
		if m == nil {
			return r, fmt.Errorf("sockperf %s: no %v in output: %s", ip, x.re, tail(out))
		}
		*x.v, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := spObs.FindStringSubmatch(out); m != nil {
		r.Observations, _ = strconv.Atoi(m[1] + m[2])
	}
	return r, nil
}

// Ping pings ip (or ip%exn0 for link-local) count times from ns with
// payload size and a fill pattern, and fails unless every reply came back
// and matched the pattern (ping reports "wrong data byte" otherwise).
func Ping(ns *Netns, ip string, count, size int, pattern string) (string, error) {
	args := []string{"ping", "-n", "-c", strconv.Itoa(count), "-i", "0.2", "-W", "2", "-s", strconv.Itoa(size)}
	if pattern != "" {
		args = append(args, "-p", pattern)
	}
	if strings.Contains(ip, ":") {
		args = append(args, "-6")
	}
	args = append(args, ip)
	out, err := ns.Run(time.Duration(count)*time.Second+10*time.Second, args...)
	if err != nil {
		return out, fmt.Errorf("ping %s: %w: %s", ip, err, out)
	}
	want := fmt.Sprintf("%d packets transmitted, %d received", count, count)
	if !strings.Contains(out, want) || strings.Contains(out, "wrong data") || strings.Contains(out, "DUP!") {
		return out, fmt.Errorf("ping %s: want %q and clean replies: %s", ip, want, out)
	}
	return out, nil
}

// WaitListening polls `ss` in the namespace until a TCP socket listens on
// port, or fails early if server p exits.
func (n *Netns) WaitListening(p *Proc, port string, timeout time.Duration) error {
	err := Eventually(timeout, func() error {
		if p.Exited() {
			return fmt.Errorf("%s exited: %v: %s", p.Name, p.Wait(0), tail(p.Output()))
		}
		out, err := n.Run(5*time.Second, "ss", "-Hltn", "sport = :"+port)
		if err != nil {
			return err
		}
		if !strings.Contains(out, ":"+port) {
			return fmt.Errorf("%s: nothing listens on port %s yet", p.Name, port)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("wait for listener: %w", err)
	}
	return nil
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}
