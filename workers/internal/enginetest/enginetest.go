// Package enginetest is the door between package workers and workertest:
// what workertest needs of the runtime's engine that workers does not
// export: its engine over memory, two test-only options, and the replay
// that package workers/replay offers. Package workers
// sets these variables when it is initialised; workertest, which imports
// both, calls them. Nothing outside the workers tree can import it, so none
// of it is part of any public API.
package enginetest

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// Replayer runs stored events through a worker's handler outside its
// consumer, as package workers builds it for workers/replay.
type Replayer interface {
	ConsumerName() string
	// Replay runs the instance's events from fromSeq (or, when it is 0,
	// from fromTime; both zero: the first kept) up to the last stored
	// when it starts; total, when not nil, is told how many the range
	// holds first.
	Replay(ctx context.Context, fromSeq uint64, fromTime time.Time, dryRun bool, total func(uint64), fn func(Replayed)) error
}

// Replayed is what replaying one event did (replay.Result).
type Replayed struct {
	Sequence      uint64
	ID, Type, Key string
	Verdict       string
	Outcomes      []string
	Err           error
}

// The verdicts of a replayed event, in one place for the runtime that
// gives them and workers/replay that names them.
const (
	ReplayApplied     = "applied"
	ReplayUnchanged   = "unchanged"
	ReplayRefused     = "refused"
	ReplayDeadLetter  = "dead-letter"
	ReplayFailed      = "failed"
	ReplayInvalid     = "invalid"
	ReplayWouldHandle = "would-handle"
)

// NewReplayer builds a Replayer; spec, h and opts are a workers.Spec, a
// workers.Handler and workers.Options.
var NewReplayer func(ctx context.Context, js jetstream.JetStream, spec, h any, opts []any) (Replayer, error)
