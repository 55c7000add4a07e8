package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
)

// Delivery is one event handed to a Handler, with what the runtime knows of
// it and the means to save progress and report outcomes.
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

	w     *Worker
	lane  string
	cp    checkpoint
	cpRev uint64
	// replay is set when the event is replayed through the handler outside
	// the consumer; stages are then not saved.
	replay bool
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
func (d *Delivery) SaveStage(ctx context.Context, v any) error {
	if d.replay {
		return nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("stage for %s: %w", d.Key, err)
	}
	next := d.cp
	next.StageSeq, next.Stage = d.Sequence, raw
	rev, err := d.w.putCheckpoint(ctx, d.lane, next, d.cpRev)
	if err != nil {
		return fmt.Errorf("save stage for %s (event %s): %w", d.Key, d.Event.ID(), err)
	}
	d.cp, d.cpRev = next, rev
	return nil
}

// State is the handler's durable state, shared by every process of this
// worker instance (the installed version, the newest host floor, ...).
func (d *Delivery) State() *State { return d.w.state }

// Emit publishes an outcome of this event: a CloudEvent of type
// dev.steward.<Spec.OutcomeNoun>.<outcome>.v1 on steward.outcomes.<worker>.<instance>.
// Its id is derived from the worker, the event's sequence and the outcome,
// so a redelivery that emits it again is stored once. Never put a secret in
// data.
func (d *Delivery) Emit(ctx context.Context, outcome string, data any) error {
	if err := events.CheckKey(outcome); err != nil {
		return fmt.Errorf("outcome name: %w", err)
	}
	e := event.New()
	e.SetID(d.w.consumerName() + "-" + strconv.FormatUint(d.Sequence, 10) + "-" + outcome)
	e.SetType(events.OutcomeType(d.w.spec.OutcomeNoun, outcome))
	e.SetSource("/steward/" + d.w.spec.Name + "/" + d.w.spec.Instance)
	e.SetSubject(d.Key)
	e.SetTime(d.w.now())
	e.SetExtension("causationid", d.Event.ID())
	if err := e.SetData(events.ContentTypeJSON, data); err != nil {
		return fmt.Errorf("outcome %s for %s: %w", outcome, d.Key, err)
	}
	msg, err := events.Encode(d.w.outcomeSubject(), e)
	if err != nil {
		return err
	}
	if _, err := d.w.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.StreamOutcomes)); err != nil {
		return fmt.Errorf("emit %s for %s (event %s): %w", outcome, d.Key, d.Event.ID(), err)
	}
	d.Log.Info().Str("outcome", outcome).Msg("outcome emitted")
	return nil
}
