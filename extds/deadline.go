package extds

import (
	"sync"
	"time"
)

// deadline is a resettable timer whose expiry closes a channel, so a
// blocked call can select on it next to its wake-up channel. It follows
// net.Pipe's pipeDeadline.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	at     time.Time     // the armed deadline, zero if none
	cancel chan struct{} // closed when the deadline has passed
}

func makeDeadline() deadline { return deadline{cancel: make(chan struct{})} }

// set arms the deadline; the zero time disarms it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the callback is running: wait until it closed cancel
	}
	d.timer = nil
	d.at = t
	closed := isClosedChan(d.cancel)
	if t.IsZero() {
		if closed {
			d.cancel = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
		}
		cancel := d.cancel
		d.timer = time.AfterFunc(dur, func() { close(cancel) })
		return
	}
	if !closed {
		close(d.cancel)
	}
}

// wait returns the channel closed at expiry.
func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

// when returns the armed deadline (zero if none).
func (d *deadline) when() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.at
}

// stop releases the timer.
func (d *deadline) stop() {
	d.mu.Lock()
	if d.timer != nil {
		d.timer.Stop()
	}
	d.mu.Unlock()
}

func isClosedChan(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
