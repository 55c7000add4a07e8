package workers

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
)

// ReplayFrom says where a replay starts: a stream sequence, or a time when
// Sequence is 0 (both zero: the first event kept).
type ReplayFrom struct {
	Sequence uint64
	Time     time.Time
}

// ReplayResult says what replaying one event did.
type ReplayResult struct {
	Sequence      uint64
	ID, Type, Key string
	// Err is why the event was not applied: it failed validation, or the
	// handler returned an error. Nil when it was applied, or in a dry run
	// when it would be handed to the handler.
	Err error
}

// Replay runs the worker's events from STEWARD_EVENTS, from the given point
// up to the last one stored when it starts, through the handler in stream
// order, outside the consumer. Checkpoints are neither read nor moved and
// stages are not saved: the handler's own idempotency (installed version,
// applied generation, ...) decides what a replayed event changes. Outcome
// ids are derived from the worker, the sequence and the outcome, so an
// outcome emitted again inside the dedupe window is stored once. With
// dryRun nothing is handled: each event is decoded, validated and reported.
func (w *Worker) Replay(ctx context.Context, from ReplayFrom, dryRun bool, fn func(ReplayResult)) error {
	r := streamread.Range{Stream: events.StreamEvents, Subjects: w.spec.Subjects, StartSeq: from.Sequence}
	if from.Sequence == 0 {
		r.StartTime = from.Time
	}
	return streamread.Each(ctx, w.js, r, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		res := ReplayResult{Sequence: meta.Sequence.Stream}
		e, err := events.Decode(m.Headers(), m.Data())
		if err == nil {
			err = w.check(m.Subject(), e)
		}
		res.ID, res.Type = e.ID(), e.Type()
		if err != nil {
			res.Err = err
			fn(res)
			return nil
		}
		res.Key = w.spec.OrderKey(e)
		if !dryRun {
			log := w.log.With().Str("key", res.Key).Str("event_id", res.ID).Str("type", res.Type).
				Uint64("seq", res.Sequence).Bool("replay", true).Logger()
			d := &Delivery{
				Event: e, Key: res.Key, Sequence: res.Sequence, Attempt: 1, Log: log,
				backend: (*replayBackend)(w), name: w.spec.Name, instance: w.spec.Instance, noun: w.spec.OutcomeNoun, now: w.o.now,
			}
			res.Err = w.call(ctx, d)
		}
		fn(res)
		return nil
	})
}
