// Package replay runs a worker's stored events through its handler again,
// outside its consumer: `steward replay` for operators, and tests that
// check what a handler does with a recorded history. It creates no stream
// and no consumer, moves no checkpoint and saves no stage; the handler's
// own idempotency (installed version, applied generation, ...) decides what
// a replayed event changes, and its outcomes are marked as a replay's
// (events.ReplayExtension) under ids of their own.
package replay

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/internal/enginetest"
)

// From says where a replay starts: a stream sequence, or a time when
// Sequence is 0 (both zero: the first event kept).
type From struct {
	Sequence uint64
	Time     time.Time
}

// What replaying one event did (Result.Verdict), by the runtime's result
// rules.
const (
	// Applied: the handler returned nil.
	Applied = enginetest.ReplayApplied
	// Unchanged: the handler returned nil and said, by the outcomes it
	// emitted (only Spec.Unchanged ones, or events.OutcomeSuperseded), that
	// nothing needed changing.
	Unchanged = enginetest.ReplayUnchanged
	// Refused: the handler refused the event (workers.Refused).
	Refused = enginetest.ReplayRefused
	// DeadLetter: the handler returned a workers.Permanent error; the
	// consumer would have dead-lettered the event. A replay never writes a
	// dead letter.
	DeadLetter = enginetest.ReplayDeadLetter
	// Failed: any other error (or a panic); the consumer would have
	// retried it.
	Failed = enginetest.ReplayFailed
	// Invalid: the event failed validation or is not this worker's type;
	// the consumer would have dead-lettered it unhandled.
	Invalid = enginetest.ReplayInvalid
	// WouldHandle: a dry run found the event valid.
	WouldHandle = enginetest.ReplayWouldHandle
)

// Result says what replaying one event did.
type Result struct {
	Sequence      uint64
	ID, Type, Key string
	// Verdict is one of the verdicts above.
	Verdict string
	// Outcomes are the names of the outcomes the handler emitted, in order.
	Outcomes []string
	// Err is why the event was not applied: it failed validation, or the
	// handler returned an error (refusals included). Nil when it was
	// applied or unchanged, or in a dry run when it would be handed to the
	// handler.
	Err error
}

// Replayer runs stored events through one worker instance's handler.
type Replayer struct{ r enginetest.Replayer }

// New checks spec and returns a Replayer of h, with the runtime's options
// (its logger, document keys, domain). It only looks the checkpoint bucket
// up, for the handler's State; a replay that handles events creates it when
// it is missing, as a starting worker does, and a dry run does not need it.
// Its metrics go to a registry of their own unless workers.WithRegisterer
// says otherwise.
func New(ctx context.Context, js jetstream.JetStream, spec workers.Spec, h workers.Handler, opts ...workers.Option) (*Replayer, error) {
	o := make([]any, len(opts))
	for i, opt := range opts {
		o[i] = opt
	}
	r, err := enginetest.NewReplayer(ctx, js, spec, h, o)
	if err != nil {
		return nil, err
	}
	return &Replayer{r: r}, nil
}

// ConsumerName is the name of the worker instance's consumer, which the
// replay does not use: "<name>-<instance>".
func (r *Replayer) ConsumerName() string { return r.r.ConsumerName() }

// Replay runs the worker's events from STEWARD_EVENTS, from the given point
// up to the last one stored when it starts, through the handler in stream
// order, and calls fn with what each did. With dryRun nothing is handled:
// each event is decoded, validated and reported. total, when not nil, is
// told how many messages the range holds before the first is read.
func (r *Replayer) Replay(ctx context.Context, from From, dryRun bool, total func(uint64), fn func(Result)) error {
	return r.r.Replay(ctx, from.Sequence, from.Time, dryRun, total, func(e enginetest.Replayed) { fn(Result(e)) })
}
