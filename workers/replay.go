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
	"github.com/steward-dev/steward/workers/internal/enginetest"
)

// The replay of stored events through a worker's handler outside its
// consumer (`steward replay`) is package workers/replay's API; it runs
// here, where the executor and the instance's checks are, reached through
// workers/internal/enginetest.

// replayer runs stored events through a Runtime's handler. Unlike Run it
// creates nothing but the bucket a handling replay writes state to: no
// stream and no durable consumer, so a replay (and above all a dry run)
// leaves no state behind on the server.
type replayer struct{ w *Runtime }

// newReplayer checks spec and returns a replayer of h. It only looks the
// checkpoint bucket up, for the handler's State; a replay that handles
// events creates it when it is missing, as a starting worker does, and a
// dry run does not need it. Its metrics go to a registry of their own
// unless WithRegisterer says otherwise.
func newReplayer(ctx context.Context, js jetstream.JetStream, spec, h any, opts []any) (enginetest.Replayer, error) {
	sp, handler, options, err := engineArgs(spec, h, opts)
	if err != nil {
		return nil, err
	}
	o := defaultOptions()
	o.registerer = prometheus.NewRegistry()
	w, err := newRuntime(js, sp, handler, o, options)
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
	return &replayer{w: w}, nil
}

func (r *replayer) ConsumerName() string { return r.w.consumerName() }

func (r *replayer) Replay(ctx context.Context, fromSeq uint64, fromTime time.Time, dryRun bool, total func(uint64), fn func(enginetest.Replayed)) error {
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
	return r.w.replay(ctx, fromSeq, fromTime, dryRun, total, fn)
}

func (w *Runtime) replay(ctx context.Context, fromSeq uint64, fromTime time.Time, dryRun bool, total func(uint64), fn func(enginetest.Replayed)) error {
	r := streamread.Range{Stream: events.StreamEvents, Subjects: w.spec.Subjects, StartSeq: fromSeq, Total: total}
	if fromSeq == 0 {
		r.StartTime = fromTime
	}
	run := &replayRun{w: w, id: strings.ToLower(ulid.Make().String())}
	return streamread.Each(ctx, w.js, r, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		res := enginetest.Replayed{Sequence: meta.Sequence.Stream, Outcomes: []string{}}
		e, err := events.Decode(m.Headers(), m.Data())
		if err == nil {
			err = w.check(m.Subject(), e)
		}
		res.ID, res.Type = e.ID(), e.Type()
		if err != nil {
			res.Err, res.Verdict = err, enginetest.ReplayInvalid
			fn(res)
			return nil
		}
		res.Key = w.spec.OrderKey(e)
		if dryRun {
			res.Verdict = enginetest.ReplayWouldHandle
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
		return enginetest.ReplayUnchanged
	case err == nil:
		return enginetest.ReplayApplied
	case IsRefused(err):
		return enginetest.ReplayRefused
	case IsPermanent(err):
		return enginetest.ReplayDeadLetter
	}
	return enginetest.ReplayFailed
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

func (b *replayEmitter) Emit(ctx context.Context, e event.Event) (bool, error) {
	e.SetExtension(events.ReplayExtension, true)
	e.SetExtension(events.ReplayIDExtension, b.run.id)
	e.SetID(e.ID() + "-replay-" + b.run.id)
	stored, err := b.run.w.backend.Emit(ctx, e)
	if err != nil || !stored {
		return stored, err
	}
	b.mu.Lock()
	b.out = append(b.out, outcomeOfType(e.Type()))
	b.mu.Unlock()
	return true, nil
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
