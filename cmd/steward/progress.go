package main

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progressDelay is how long a command runs before it reports progress: a
// command that ends sooner prints nothing more than its result.
const progressDelay = time.Second

// progressInterval is how often a line is printed when stderr is not a
// terminal (a log, a CI job); on a terminal the counter is redrawn every
// progressRedraw.
const (
	progressInterval = 5 * time.Second
	progressRedraw   = 200 * time.Millisecond
)

// progress is the one progress reporter of long commands (publish --file,
// replay, export): a counter redrawn in place on a terminal, a line every
// few seconds otherwise, and nothing at all for a command that ends
// within a second. It writes to stderr only, so stdout stays the result.
type progress struct {
	w     io.Writer
	what  string
	term  bool
	start time.Time

	done  atomic.Uint64
	total atomic.Uint64

	mu       sync.Mutex
	shown    bool
	lastLine time.Time

	stop chan struct{}
	wg   sync.WaitGroup
}

// startProgress starts reporting on w (stderr) what is being done
// ("exported", "published"), redrawing in place when w is a terminal and
// stdout is not one: when both are, the result's own lines would land on
// the counter's line, so the report is a line every few seconds instead.
// finish must be called.
func startProgress(w, stdout io.Writer, what string) *progress {
	p := newProgress(w, what, isTerminal(w) && !isTerminal(stdout), time.Now())
	every := progressInterval
	if p.term {
		every = progressRedraw
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case now := <-t.C:
				p.tick(now)
			}
		}
	}()
	return p
}

// newProgress is a reporter that draws only when tick is called, for
// tests with their own clock.
func newProgress(w io.Writer, what string, term bool, start time.Time) *progress {
	return &progress{w: w, what: what, term: term, start: start, stop: make(chan struct{})}
}

// setTotal says how many items there are (0: unknown).
func (p *progress) setTotal(n uint64) { p.total.Store(n) }

// add counts n items done.
func (p *progress) add(n uint64) { p.done.Add(n) }

// tick draws the report as of now, if the command has run long enough.
func (p *progress) tick(now time.Time) {
	elapsed := now.Sub(p.start)
	if elapsed < progressDelay {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.term {
		fmt.Fprintf(p.w, "\r\x1b[K%s", p.text(elapsed))
		p.shown = true
		return
	}
	if p.shown && now.Sub(p.lastLine) < progressInterval {
		return
	}
	fmt.Fprintln(p.w, p.text(elapsed))
	p.shown, p.lastLine = true, now
}

func (p *progress) text(elapsed time.Duration) string {
	done, total := p.done.Load(), p.total.Load()
	rate := float64(done) / elapsed.Seconds()
	if total > 0 {
		return fmt.Sprintf("%s %d of %d (%d%%), %s, %.0f/s", p.what, done, total, done*100/total, elapsed.Round(time.Second), rate)
	}
	return fmt.Sprintf("%s %d, %s, %.0f/s", p.what, done, elapsed.Round(time.Second), rate)
}

// finish stops the reporter; on a terminal the counter line is ended so the
// command's summary starts on a line of its own.
func (p *progress) finish() {
	select {
	case <-p.stop:
		return
	default:
		close(p.stop)
	}
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.term && p.shown {
		fmt.Fprintln(p.w)
	}
}
