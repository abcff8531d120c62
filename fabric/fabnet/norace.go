//go:build !race

package fabnet

import "net"

// raceSync is a no-op outside race builds; see race.go.
type raceSync struct{}

func newRaceSync(net.Conn) raceSync { return raceSync{} }
func (raceSync) beforeWrite()       {}
func (raceSync) afterRead()         {}
func (raceSync) release(net.Conn)   {}
