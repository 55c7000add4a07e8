// Package enginetest is the door between package workers and workertest:
// what workertest needs of the runtime's engine that workers does not
// export (its engine over memory, two test-only options). Package workers
// sets these variables when it is initialised; workertest, which imports
// both, calls them. Nothing outside the workers tree can import it, so none
// of it is part of any public API.
package enginetest

import (
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/internal/memory"
)

// Engine is the runtime's engine (its keyed queue, executor and settler)
// over the parts of package memory, as package workers builds it for
// workertest. It has no goroutine of its own: Deliver runs what it is
// given to its end on the caller's.
type Engine interface {
	// Deliver queues msgs together, as a burst the engine has pulled, and
	// runs every lane they give work until each of its events is settled
	// or parked (out of attempts), then hands back whatever is still
	// queued (naked). unchecked marks the events validated, so that a test
	// can show what a handler does with data the runtime would refuse.
	Deliver(msgs []*memory.Msg, unchecked bool)
	// Store is the instance's store over the KV, as the engine signs and
	// verifies with it.
	Store() *events.Store
	// State is the instance's *workers.State.
	State() any
}

// Config is what an Engine is built from. Spec, Handler and Options are
// package workers' Spec, Handler and []Option, which this package cannot
// name (workers imports it).
type Config struct {
	Spec    any
	Handler any
	Options []any
	KV      *memory.KV
	Streams *memory.Streams
	// MaxFailures parks an event once its handler has failed that many
	// times (at least once: a test must end).
	MaxFailures int
}

// NewEngine builds an Engine.
var NewEngine func(Config) (Engine, error)

// StatusInterval and Resync make the workers.Option that sets how often,
// at most, a runtime writes its status document, and how often a stream
// reader reads its subjects again with nothing to wake it: knobs a test
// turns down to see in milliseconds what a worker does in seconds or
// minutes, and no operator needs.
var StatusInterval, Resync func(time.Duration) any
