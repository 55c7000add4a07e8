package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
)

// ReplayFrom says where a replay starts: a stream sequence, or a time when
// Sequence is 0 (both zero: the first event kept).
type ReplayFrom struct {
	Sequence uint64
	Time     time.Time
}

// What replaying one event did (ReplayResult.Verdict), by the runtime's
// result rules.
const (
	// ReplayApplied: the handler returned nil.
	ReplayApplied = "applied"
	// ReplayUnchanged: the handler returned nil and said, by the outcomes it
	// emitted (only Spec.Unchanged ones, or events.OutcomeSuperseded), that
	// nothing needed changing.
	ReplayUnchanged = "unchanged"
	// ReplayRefused: the handler refused the event (Refused).
	ReplayRefused = "refused"
	// ReplayDeadLetter: the handler returned a Permanent error; the
	// consumer would have dead-lettered the event. A replay never writes a
	// dead letter.
	ReplayDeadLetter = "dead-letter"
	// ReplayFailed: any other error (or a panic); the consumer would have
	// retried it.
	ReplayFailed = "failed"
	// ReplayInvalid: the event failed validation or is not this worker's
	// type; the consumer would have dead-lettered it unhandled.
	ReplayInvalid = "invalid"
	// ReplayWouldHandle: a dry run found the event valid.
	ReplayWouldHandle = "would-handle"
)

// ReplayResult says what replaying one event did.
type ReplayResult struct {
	Sequence      uint64
	ID, Type, Key string
	// Verdict is one of the Replay* verdicts.
	Verdict string
	// Outcomes are the names of the outcomes the handler emitted, in order.
	Outcomes []string
	// Err is why the event was not applied: it failed validation, or the
	// handler returned an error (refusals included). Nil when it was
	// applied or unchanged, or in a dry run when it would be handed to the
	// handler.
	Err error
}

// Replayer runs stored events through a worker's handler outside its
// consumer. Unlike New it creates nothing: no stream, no bucket and no
// durable consumer, so a replay (and above all a dry run) leaves no state
// behind on the server.
type Replayer struct{ w *Runtime }

// NewReplayer checks spec and returns a Replayer of h. It only looks the
// checkpoint bucket up, for the handler's State; a replay that handles
// events creates it when it is missing, as a starting worker does, and a
// dry run does not need it. Its metrics go to a registry of their own unless
// WithRegisterer says otherwise.
func NewReplayer(ctx context.Context, js jetstream.JetStream, spec Spec, h Handler, opts ...Option) (*Replayer, error) {
	o := defaultOptions()
	o.registerer = prometheus.NewRegistry()
	w, err := newRuntime(js, spec, h, o, opts)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	switch {
	case err == nil:
		if err := w.bindStore(ctx, kv); err != nil {
			return nil, err
		}
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, fmt.Errorf("look up bucket %s: %w", events.CheckpointBucket, err)
	}
	return &Replayer{w: w}, nil
}

// ConsumerName is the name of the worker instance's consumer, which the
// replay does not use: "<name>-<instance>".
func (r *Replayer) ConsumerName() string { return r.w.consumerName() }

// Replay runs the worker's events from STEWARD_EVENTS, from the given point
// up to the last one stored when it starts, through the handler in stream
// order. Checkpoints are neither read nor moved and stages are not saved:
// the handler's own idempotency (installed version, applied generation,
// ...) decides what a replayed event changes. Outcomes are published on the
// instance's outcome subject marked with events.ReplayExtension, under ids of
// their own (the live id and the run's), so the live history is never
// mistaken for a replay nor deduplicated against one. A Permanent error is
// reported, never dead-lettered. With dryRun nothing is handled: each event
// is decoded, validated and reported. total, when not nil, is told how many
// messages the range holds before the first is read.
func (r *Replayer) Replay(ctx context.Context, from ReplayFrom, dryRun bool, total func(uint64), fn func(ReplayResult)) error {
	if !dryRun && !r.w.storeBound() {
		// A replay that handles events writes the handler's state, as the
		// worker would: the bucket is made as a starting worker makes it.
		// A dry run writes nothing and makes nothing.
		kv, err := ensureBus(ctx, r.w.js, r.w.o.replicas)
		if err != nil {
			return err
		}
		if err := r.w.bindStore(ctx, kv); err != nil {
			return err
		}
	}
	return r.w.replay(ctx, from, dryRun, total, fn)
}

// Replay is Replayer.Replay for a Runtime New made.
func (w *Runtime) Replay(ctx context.Context, from ReplayFrom, dryRun bool, fn func(ReplayResult)) error {
	return w.replay(ctx, from, dryRun, nil, fn)
}

func (w *Runtime) replay(ctx context.Context, from ReplayFrom, dryRun bool, total func(uint64), fn func(ReplayResult)) error {
	r := streamread.Range{Stream: events.StreamEvents, Subjects: w.spec.Subjects, StartSeq: from.Sequence, Total: total}
	if from.Sequence == 0 {
		r.StartTime = from.Time
	}
	run := &replayRun{w: w, id: strings.ToLower(ulid.Make().String())}
	return streamread.Each(ctx, w.js, r, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		res := ReplayResult{Sequence: meta.Sequence.Stream, Outcomes: []string{}}
		e, err := events.Decode(m.Headers(), m.Data())
		if err == nil {
			err = w.check(m.Subject(), e)
		}
		res.ID, res.Type = e.ID(), e.Type()
		if err != nil {
			res.Err, res.Verdict = err, ReplayInvalid
			fn(res)
			return nil
		}
		res.Key = w.spec.OrderKey(e)
		if dryRun {
			res.Verdict = ReplayWouldHandle
			fn(res)
			return nil
		}
		log := w.log.With().Str("key", res.Key).Str("event_id", res.ID).Str("type", res.Type).
			Uint64("seq", res.Sequence).Bool("replay", true).Logger()
		b := &replayEmitter{run: run}
		d := &Delivery{
			Event: e, Key: res.Key, Sequence: res.Sequence, Attempt: 1, Log: log,
			backend: b, name: w.spec.Name, instance: w.spec.Instance, noun: w.spec.OutcomeNoun, now: w.o.now,
		}
		res.Err = w.exec.call(ctx, d)
		res.Outcomes = b.names()
		res.Verdict = w.replayVerdict(res.Err, res.Outcomes)
		fn(res)
		return nil
	})
}

// replayVerdict applies the runtime's result rules to a replayed event. A
// handler that returned nil and emitted only outcomes its Spec calls
// unchanged found nothing to do: that is how a replay tells "applied" from
// "found nothing to do" without asking the handler anything new.
func (w *Runtime) replayVerdict(err error, outcomes []string) string {
	unchanged := func(o string) bool { return o == events.OutcomeSuperseded || slices.Contains(w.spec.Unchanged, o) }
	switch {
	case err == nil && len(outcomes) > 0 && !slices.ContainsFunc(outcomes, func(o string) bool { return !unchanged(o) }):
		return ReplayUnchanged
	case err == nil:
		return ReplayApplied
	case IsRefused(err):
		return ReplayRefused
	case IsPermanent(err):
		return ReplayDeadLetter
	}
	return ReplayFailed
}

// replayRun is one replay: the id its outcomes are marked with.
type replayRun struct {
	w  *Runtime
	id string
}

// replayEmitter is the backend of one replayed event: outcomes are marked
// and published under the run's ids, their names recorded for the verdict;
// no stage is saved, since a replay runs outside the consumer and must not
// move what the consumer resumes from.
type replayEmitter struct {
	run *replayRun
	mu  sync.Mutex
	out []string
}

func (b *replayEmitter) Emit(ctx context.Context, e event.Event) error {
	e.SetExtension(events.ReplayExtension, true)
	e.SetExtension(events.ReplayIDExtension, b.run.id)
	e.SetID(e.ID() + "-replay-" + b.run.id)
	if err := b.run.w.backend.Emit(ctx, e); err != nil {
		return err
	}
	b.mu.Lock()
	b.out = append(b.out, outcomeOfType(e.Type()))
	b.mu.Unlock()
	return nil
}

func (b *replayEmitter) names() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string{}, b.out...)
}

func (b *replayEmitter) SaveStage(context.Context, *Delivery, json.RawMessage) error { return nil }

func (b *replayEmitter) State() *State { return b.run.w.state }

// outcomeOfType is the <outcome> of dev.steward.<noun>.<outcome>.v1.
func outcomeOfType(typ string) string {
	rest := strings.TrimSuffix(typ, ".v1")
	return rest[strings.LastIndexByte(rest, '.')+1:]
}
