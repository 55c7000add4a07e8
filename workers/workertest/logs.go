package workertest

import (
	"bytes"
	"sync"
)

// Logs is a log sink that a worker's goroutines write to while the test
// reads it: pass it to zerolog.New and give the logger to the worker with
// workers.WithLogger, or use it as a command's output. A bytes.Buffer
// shared that way is a data race, because zerolog writes each line from
// whichever goroutine logged it. The zero value is ready to use.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p whole: a line written in one call is never interleaved
// with another's.
func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String is everything written so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
