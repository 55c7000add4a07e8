package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/tracing"
)

// Delivery is one event handed to a Handler, with what the runtime knows of
// it and the means to save progress and report outcomes.
//
// Everything a Delivery does beyond its own event goes through its
// backend: the runtime's writes to its streams and checkpoint bucket, on
// JetStream or, under workertest, in memory; a replay's marks and
// publishes its outcomes and saves no stage.
type Delivery struct {
	// Event has passed validation: a known type, data that meets its
	// schema, a valid key.
	Event event.Event
	// Key is the order key (see Spec.OrderKey).
	Key string
	// Sequence is the event's sequence in STEWARD_EVENTS.
	Sequence uint64
	// Attempt is 1 on the first delivery and counts redeliveries.
	Attempt uint64
	// Log carries the worker, key, event id, type, sequence and attempt.
	// Never log secrets through it.
	Log zerolog.Logger

	backend backend
	// name, instance and noun are the Spec's, for outcome ids and types.
	name, instance, noun string
	now                  func() time.Time
	// lane, cp and cpRev are the runtime's: the checkpoint of the event's
	// lane as last read or written, which SaveStage moves and apply.go
	// settles from. Outside the runtime cp only carries the stage.
	lane  string
	cp    checkpoint
	cpRev uint64
}

// backend is what a Delivery acts through: where outcomes go, where a
// stage is kept and the worker instance's state. One serves one worker
// instance and may be called from several handlers at once.
type backend interface {
	// Emit stores an outcome Delivery.Emit built (its id, type, source,
	// subject, time, causation and data are set): the runtime publishes it
	// on the instance's outcome subject, deduplicated by its id. stored is
	// false when an outcome of that id was already stored, and this one
	// was dropped.
	Emit(ctx context.Context, outcome event.Event) (stored bool, err error)
	// SaveStage records stage as how far the handler got with d's event,
	// for a redelivery of the same event to resume from. An error wrapping
	// events.ErrConflict says another process moved the key on meanwhile.
	SaveStage(ctx context.Context, d *Delivery, stage json.RawMessage) error
	// State is the worker instance's durable state.
	State() *State
}

// DataAs decodes the event's data into v. The schema has already refused
// unknown fields, so v only needs the fields the handler reads.
func (d *Delivery) DataAs(v any) error {
	dec := json.NewDecoder(bytes.NewReader(d.Event.Data()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Permanent(fmt.Errorf("data of event %s (%s): %w", d.Event.ID(), d.Key, err))
	}
	return nil
}

// LoadStage decodes the stage an earlier delivery of this same event saved
// into v. It reports false when there is none, and then leaves v alone.
func (d *Delivery) LoadStage(v any) (bool, error) {
	if d.cp.StageSeq != d.Sequence || len(d.cp.Stage) == 0 {
		return false, nil
	}
	if err := json.Unmarshal(d.cp.Stage, v); err != nil {
		return false, fmt.Errorf("stage saved for %s at sequence %d: %w", d.Key, d.Sequence, err)
	}
	return true, nil
}

// SaveStage records how far the handler got with this event, so that a
// redelivery after a crash resumes there instead of starting over. The
// write is a compare-and-swap on the checkpoint: if another process has
// moved the key on meanwhile, SaveStage fails and the handler should stop.
// A replay (package workers/replay) saves nothing.
func (d *Delivery) SaveStage(ctx context.Context, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("stage for %s: %w", d.Key, err)
	}
	if err := d.backend.SaveStage(ctx, d, raw); err != nil {
		return fmt.Errorf("save stage for %s (event %s): %w", d.Key, d.Event.ID(), err)
	}
	// Later LoadStage calls of this delivery see what it saved, as a
	// redelivery would.
	d.cp.StageSeq, d.cp.Stage = d.Sequence, raw
	return nil
}

// State is the handler's durable state, shared by every process of this
// worker instance (the installed version, the newest host floor, ...).
func (d *Delivery) State() *State { return d.backend.State() }

// Emit publishes the outcome of this event: a CloudEvent of type
// dev.steward.<Spec.OutcomeNoun>.<outcome>.v1 on steward.outcomes.<worker>.<instance>.
// An event has one outcome. Its id is derived from the worker, the
// instance and the event's sequence, not from the outcome, so whatever a
// later delivery of the same event emits inside the outcomes stream's
// dedupe window is dropped and the first stored stands: an event applied
// and then, its process killed before the checkpoint, redelivered behind
// a newer one of its key keeps "applied" and gains no "superseded" (and a
// join redelivered after it armed its box keeps "armed" and gains no
// "armed-already").
// Emit returns nil then too, and logs it. Never put a secret in data.
func (d *Delivery) Emit(ctx context.Context, outcome string, data any) error {
	e, err := d.outcome(outcome, data)
	if err == nil {
		// The outcome continues the delivery's span, or, when nothing
		// traces here, the event's own trace: a console that started a
		// trace finds the outcome in it either way.
		tctx := ctx
		if !trace.SpanContextFromContext(ctx).IsValid() {
			tctx = tracing.Extract(ctx, &d.Event)
		}
		tracing.Inject(tctx, &e)
	}
	if err != nil {
		return err
	}
	stored, err := d.backend.Emit(ctx, e)
	if err != nil {
		return fmt.Errorf("emit %s for %s (event %s): %w", outcome, d.Key, d.Event.ID(), err)
	}
	if !stored {
		d.Log.Info().Str("outcome", outcome).Str("outcome_id", e.ID()).
			Msg("this event's outcome was already stored by an earlier delivery or attempt, and it stands; " + outcome + " was not stored (an event keeps its first outcome)")
		return nil
	}
	d.Log.Info().Str("outcome", outcome).Msg("outcome emitted")
	return nil
}

// outcome builds the outcome event, the same whatever the Backend, so ids
// and types seen in a test are the ones the runtime publishes.
func (d *Delivery) outcome(outcome string, data any) (event.Event, error) {
	if err := events.CheckKey(outcome); err != nil {
		return event.Event{}, fmt.Errorf("outcome name: %w", err)
	}
	e := event.New()
	e.SetID(d.name + "-" + d.instance + "-" + strconv.FormatUint(d.Sequence, 10))
	e.SetType(events.OutcomeType(d.noun, outcome))
	e.SetSource("/steward/" + d.name + "/" + d.instance)
	e.SetSubject(d.Key)
	e.SetTime(d.now())
	e.SetExtension("causationid", d.Event.ID())
	if err := e.SetData(events.ContentTypeJSON, data); err != nil {
		return event.Event{}, fmt.Errorf("outcome %s for %s: %w", outcome, d.Key, err)
	}
	return e, nil
}

// runtimeBackend is the consumer's backend: outcomes on JetStream, stages
// in the key's checkpoint. One serves every delivery of the instance, so a
// delivery costs no allocation for it.
type runtimeBackend struct {
	in    *instance
	cps   *checkpointStore
	state *State
}

func (b *runtimeBackend) Emit(ctx context.Context, e event.Event) (bool, error) {
	msg, err := events.Encode(b.in.outcomeSubject(), e)
	if err != nil {
		return false, err
	}
	// Signed, so that a message someone made the bus store on this
	// subject (by reflection, docs/design.md §7) is told from the
	// instance's own: readers mark an outcome that does not verify as
	// forged. Live, superseded and replayed outcomes all pass here.
	events.SignMessage(msg, events.StreamOutcomes, b.in.o.domain, b.in.o.signer, events.OutcomeProofContent(e))
	ack, err := b.in.streams.Publish(ctx, msg, events.StreamOutcomes)
	if err != nil {
		return false, err
	}
	if ack.Duplicate {
		return false, nil
	}
	b.in.m.emitted(b.in.spec.OutcomeNoun, e.Type(), e.Data())
	return true, nil
}

func (b *runtimeBackend) SaveStage(ctx context.Context, d *Delivery, stage json.RawMessage) error {
	next := d.cp
	next.StageSeq, next.Stage = d.Sequence, stage
	rev, err := b.cps.write(ctx, d.lane, next, d.cpRev)
	if err != nil {
		return err
	}
	d.cp, d.cpRev = next, rev
	return nil
}

func (b *runtimeBackend) State() *State { return b.state }
