package workers

import (
	"sync"
	"sync/atomic"
	"time"
)

// runnerIdle is how long a runner with nothing to do waits for more before
// it exits: long enough to span the gaps of a steady stream of events,
// short enough that an idle worker holds no goroutines for long.
const runnerIdle = 2 * time.Second

// runners are the goroutines that run lanes and confirm acks, kept between
// one piece of work and the next. A new goroutine starts with a small
// stack, and an event's way through decoding, the schema's validation
// (regular expressions) and the handler grew it several times, each time
// by copying it: with a goroutine per event, that copying was about 7% of
// the process's CPU at 1,000 events/s. A runner keeps the stack
// it grew (until the garbage collector finds it idle and shrinks it) for
// the work that follows.
type runners struct {
	work chan func()
	// idleFor is runnerIdle but in tests.
	idleFor time.Duration
	// started counts the runners started; live holds those running.
	started atomic.Int64
	live    sync.WaitGroup
}

func newRunners() *runners { return &runners{work: make(chan func()), idleFor: runnerIdle} }

// run runs f on an idle runner, or on a new one when none is idle. It
// never blocks, so a caller may hold w.mu.
func (r *runners) run(f func()) {
	select {
	case r.work <- f:
	default:
		r.started.Add(1)
		r.live.Add(1)
		go r.loop(f)
	}
}

// loop runs f and then whatever run hands it, until nothing comes for
// idleFor.
func (r *runners) loop(f func()) {
	defer r.live.Done()
	idle := time.NewTimer(r.idleFor)
	defer idle.Stop()
	for {
		f()
		idle.Reset(r.idleFor)
		select {
		case f = <-r.work:
		case <-idle.C:
			return
		}
	}
}
