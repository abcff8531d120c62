package fabnet

import (
	"testing"

	"github.com/exn-project/exn/fabric/fabrictest"
)

func TestConformance(t *testing.T) { fabrictest.Run(t, factory(nil)) }

// TestConformanceSmallMailbox runs the suite with 4-slot mailboxes: one
// credit per grant, so the credit-wait path runs on nearly every message;
// and with heartbeat liveness, so the suite covers both (TestConformance
// runs the default, swim).
func TestConformanceSmallMailbox(t *testing.T) {
	fabrictest.Run(t, factory(func(c *Config) { c.MailboxSlots = 4; c.Liveness = LivenessHeartbeat }))
}

func BenchmarkFabric(b *testing.B) { fabrictest.Bench(b, factory(nil)) }
