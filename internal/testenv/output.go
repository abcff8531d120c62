package testenv

import (
	"bytes"
	"sync"
)

// Output collects a child process's stdout and stderr. Write and String may
// be called from any goroutines at once, so a test can read what the child
// printed so far while it still runs.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String returns what was written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
