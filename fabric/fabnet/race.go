//go:build race

package fabnet

import (
	"net"
	"sync"
)

// The race detector cannot see the happens-before edge a TCP connection
// creates: bytes written by one goroutine are read by another, and what
// the reader does next (write a region, queue a notification) follows
// everything the writer did first. When both ends live in one test
// process the detector would report those as races. In race builds each
// direction of a connection gets a mutex that the writer locks and
// unlocks before every write and the reader after every frame it reads,
// which is exactly the ordering the wire provides — no more: the key is
// the connection's (source, destination) address pair.

var raceEdges sync.Map // "src>dst" → *sync.Mutex

func raceEdge(src, dst net.Addr) *sync.Mutex {
	m, _ := raceEdges.LoadOrStore(src.String()+">"+dst.String(), new(sync.Mutex))
	return m.(*sync.Mutex)
}

type raceSync struct{ w, r *sync.Mutex }

func newRaceSync(c net.Conn) raceSync {
	return raceSync{w: raceEdge(c.LocalAddr(), c.RemoteAddr()), r: raceEdge(c.RemoteAddr(), c.LocalAddr())}
}

func (r raceSync) beforeWrite() {
	r.w.Lock()
	r.w.Unlock()
}

func (r raceSync) afterRead() {
	r.r.Lock()
	r.r.Unlock()
}

func (r raceSync) release(c net.Conn) {
	raceEdges.Delete(c.LocalAddr().String() + ">" + c.RemoteAddr().String())
}
