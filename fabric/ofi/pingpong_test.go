//go:build ofi && cgo

package ofi_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exn-project/exn/fabric"
	"github.com/exn-project/exn/fabric/fabrictest"
	"github.com/exn-project/exn/fabric/ofi"
	"github.com/exn-project/exn/internal/testenv"
)

// Environment of the echo child of BenchmarkPingPong2Proc.
const (
	echoProvEnv = "EXN_OFI_ECHO_PROVIDER" // provider; set only in the child
	echoPeerEnv = "EXN_OFI_ECHO_PEER"     // the parent's fi_getname, hex
	echoNamePfx = "EXN-OFI-ECHO-NAME "    // the child's fi_getname line on stdout
)

// TestHelperOFIEcho is the child process of BenchmarkPingPong2Proc: node
// 2, VPID 1, echoing every message back to its sender until stdin
// closes. It does nothing unless echoProvEnv is set.
func TestHelperOFIEcho(t *testing.T) {
	prov := os.Getenv(echoProvEnv)
	if prov == "" {
		t.Skip("helper process of BenchmarkPingPong2Proc")
	}
	parent, err := hex.DecodeString(os.Getenv(echoPeerEnv))
	if err != nil {
		t.Fatal(err)
	}
	n, ep, name := openNamed(t, prov, 2)
	if err := n.AddPeer(1, parent); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("%s%x\n", echoNamePfx, name)
	go func() { // the parent closes our stdin (or dies): stop
		b := make([]byte, 1)
		os.Stdin.Read(b)
		ep.Close()
	}()
	fabrictest.Echo(ep)
}

// openNamed opens node on prov and its VPID 1, both closed when tb ends,
// and returns the NIC's fi_getname address, which the other process adds
// as its peer.
func openNamed(tb testing.TB, prov string, node fabric.NodeID) (*ofi.NIC, fabric.Endpoint, []byte) {
	tb.Helper()
	nic, err := ofi.Open(ofi.Config{Provider: prov, Node: node, Bind: bindFor(prov)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nic.Close() })
	n := nic.(*ofi.NIC)
	ep := fabrictest.OpenEP(tb, nic, 1)
	name, err := n.Name()
	if err != nil {
		tb.Fatal(err)
	}
	return n, ep, name
}

// BenchmarkPingPong2Proc measures VELO one-way latency (half the round
// trip of a 120 B message, p50 and p99) between this process and an echo
// child process, each with its own NIC: the figure `make bench-ofi`
// compares with fi_pingpong.
func BenchmarkPingPong2Proc(b *testing.B) {
	for _, prov := range []string{"shm", "tcp"} {
		b.Run(prov, func(b *testing.B) { benchPingPong2Proc(b, prov) })
	}
}

func benchPingPong2Proc(b *testing.B, prov string) {
	n, ep, name := openNamed(b, prov, 1)
	_, stdin, stdout := testenv.StartPipedHelper(b, "TestHelperOFIEcho", echoProvEnv+"="+prov, echoPeerEnv+"="+hex.EncodeToString(name))
	exited := make(chan struct{})
	defer func() {
		// Closing stdin stops the child, which closes its NIC and exits
		// (its stdout then ends). Wait for that before b's cleanup kills
		// it: a child killed inside its NIC's Close leaves the shm
		// provider's region file in /dev/shm.
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(10 * time.Second): // a hang detector; the cleanup kills it
		}
	}()
	var child []byte
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if h, ok := strings.CutPrefix(sc.Text(), echoNamePfx); ok {
			var err error
			if child, err = hex.DecodeString(h); err != nil {
				b.Fatal(err)
			}
			break
		}
	}
	if child == nil {
		b.Fatal("echo child printed no address")
	}
	go func() { // drain the rest of the child's output, until it exits
		defer close(exited)
		for sc.Scan() {
		}
	}()
	if err := n.AddPeer(2, child); err != nil {
		b.Fatal(err)
	}
	out := []fabric.Message{{Peer: fabric.Addr{Node: 2, VPID: 1}, Tag: 1, Len: fabric.MaxVELOPayload}}
	in := make([]fabric.Message, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	round := func() {
		if _, err := ep.Send(ctx, out); err != nil {
			b.Fatal(err)
		}
		if _, err := fabrictest.AwaitRecv(ctx, ep, in); err != nil {
			b.Fatal(err)
		}
	}
	const warmup = 1000 // connection set-up, credit query, caches
	for range warmup {
		round()
	}
	lat := make([]int64, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range lat {
		t0 := time.Now()
		round()
		lat[i] = int64(time.Since(t0)) / 2
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
}
