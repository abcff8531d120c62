package members

import (
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestFabricProfile holds the properties of the Fabric profile that the
// idle cost and the detection bounds rest on (docs/membership.md, "The
// profile" and "Timer ticks and compression"), so that a retuning that
// breaks one fails here rather than in perf/cluster.sh.
func TestFabricProfile(t *testing.T) {
	c := memberlist.DefaultLANConfig()
	Fabric.apply(c)
	gossipPerSec := float64(c.GossipNodes) / c.GossipInterval.Seconds()
	for _, tc := range []struct {
		what string
		ok   bool
	}{
		// memberlist starts both tickers together (state.go, schedule):
		// equal intervals fire together, so gossip wakes nothing alone.
		{"gossip on the probe's ticks", c.GossipInterval == c.ProbeInterval},
		// The 1,000-node simulation's 5 s bound was measured at 20.
		{"at least 20 gossip messages a second", gossipPerSec >= 20},
		{"a probe's timeout within its period", c.ProbeTimeout < c.ProbeInterval},
		// A probe or ack never compresses; trying cost 7 % of idle CPU.
		{"no compression", !c.EnableCompression},
		{"the profile written whole", c.ProbeInterval == Fabric.ProbeInterval &&
			c.SuspicionMult == Fabric.SuspicionMult && c.PushPullInterval == Fabric.PushPullInterval &&
			c.TCPTimeout == Fabric.StreamTimeout && c.ProbeInterval == 250*time.Millisecond},
	} {
		if !tc.ok {
			t.Errorf("%s: no (%+v)", tc.what, Fabric)
		}
	}
}
