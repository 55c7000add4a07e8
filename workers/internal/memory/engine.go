package memory

import "github.com/steward-dev/steward/events"

// Engine is the runtime's engine (its keyed queue, executor and settler)
// over the parts of this package, as package workers builds it for
// workertest. It has no goroutine of its own: Deliver runs what it is
// given to its end on the caller's.
type Engine interface {
	// Deliver queues msgs together, as a burst the engine has pulled, and
	// runs every lane they give work until each of its events is settled
	// or parked (out of attempts), then hands back whatever is still
	// queued (naked). unchecked marks the events validated, so that a test
	// can show what a handler does with data the runtime would refuse.
	Deliver(msgs []*Msg, unchecked bool)
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
	KV      *KV
	Streams *Streams
	// MaxFailures parks an event once its handler has failed that many
	// times (0: never).
	MaxFailures int
}

// NewEngine builds an Engine; package workers sets it when it is
// initialised, so that workertest, which imports both, reaches the engine
// through this internal package without workers exporting it.
var NewEngine func(Config) (Engine, error)
