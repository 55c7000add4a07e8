package workers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/tracing"
)

// instance is what every part of the engine knows of the worker instance it
// serves: its Spec, its options (with their defaults filled in), its
// connection, logger, metrics and tracer, and where a delivery's outcomes
// and stages go. The runtime, the executor and the settler share one.
type instance struct {
	spec    Spec
	o       options
	js      jetstream.JetStream
	log     zerolog.Logger
	m       *instanceMetrics
	tracer  trace.Tracer
	backend *runtimeBackend
	// streams is what the engine publishes to and reads back beyond its
	// source (streams.go).
	streams streams
	// handlerCtx outlives the Run context by the shutdown grace, so
	// in-flight handlers finish what they started (set by Run).
	handlerCtx context.Context
	// processSpan and supersedeSpan name the two spans a delivery can
	// have, made once: a name built for every event was two of the
	// allocations the collector then had to chase at the steady rate.
	processSpan, supersedeSpan spanOperation
}

// spanOperation is a delivery span's messaging operation and the span's
// name, which is the operation and the consumer's: kept together, so one
// cannot be given without the other.
type spanOperation struct{ operation, name string }

func (in *instance) spanOperation(operation string) spanOperation {
	return spanOperation{operation: operation, name: operation + " " + in.consumerName()}
}

// consumerSpan starts every delivery's span as a consumer's.
var consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}

func (in *instance) consumerName() string { return in.spec.Name + "-" + in.spec.Instance }

func (in *instance) outcomeSubject() string {
	return events.OutcomeSubject(in.spec.Name, in.spec.Instance)
}

func (in *instance) dlqSubject() string { return events.DLQSubject(in.spec.Name, in.spec.Instance) }

func (in *instance) now() time.Time { return in.o.now() }

// logFor is the logger of one delivery, with the fields docs/design.md §4 names.
func (in *instance) logFor(h *held) zerolog.Logger {
	if in.log.GetLevel() == zerolog.Disabled {
		// Nothing is written: the fields would only be allocated.
		return in.log
	}
	return in.log.With().
		Str("key", h.key).Str("event_id", h.event.ID()).Str("type", h.event.Type()).
		Uint64("seq", h.seq).Uint64("delivery", h.delivered).Uint64("attempt", h.delivered+h.attempts).Logger()
}

// delivery is what the handler (or Rank) is given for h.
func (in *instance) delivery(h *held, cp checkpoint, rev uint64, log zerolog.Logger) *Delivery {
	return &Delivery{
		Event: h.event, Key: h.key, Sequence: h.seq, Attempt: h.delivered + h.attempts, Log: log,
		backend: in.backend, name: in.spec.Name, instance: in.spec.Instance, noun: in.spec.OutcomeNoun, now: in.o.now,
		lane: h.lane, cp: cp, cpRev: rev,
	}
}

// startSpan starts the span of one delivery (or of settling it as
// superseded) in the trace of its publisher, as the CloudEvents tracing
// extension carries it, with OpenTelemetry's messaging and CloudEvents
// attributes, as op (processSpan or supersedeSpan). The handler gets its
// context, so outcomes continue it. The attributes are set only on a span
// that records: building them for every event where nothing traces cost
// more than the rest of the span.
func (in *instance) startSpan(h *held, op spanOperation) (context.Context, trace.Span) {
	ctx, span := in.tracer.Start(tracing.Extract(in.handlerCtx, &h.event), op.name, consumerSpan...)
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(tracing.EventAttributes(h.event)...)
	span.SetAttributes(
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", op.operation),
		attribute.String("messaging.destination.name", h.msg.Subject()),
		attribute.String("messaging.consumer.group.name", in.consumerName()),
		attribute.String("messaging.message.id", h.event.ID()),
		attribute.String("steward.worker", in.spec.Name),
		attribute.String("steward.instance", in.spec.Instance),
		attribute.String("steward.key", h.key),
		attribute.Int64("steward.stream.sequence", int64(h.seq)),
		attribute.Int64("steward.attempt", int64(h.delivered+h.attempts)),
	)
	return ctx, span
}

// check is the runtime's validation: the shared event validation, a type
// this worker handles, and for keyed subjects a subject that names the
// event's own key.
func (in *instance) check(subject string, e event.Event) error {
	if err := events.Validate(e); err != nil {
		return err
	}
	if !slices.Contains(in.spec.Types, e.Type()) {
		return fmt.Errorf("%w: worker %s does not handle type %q", events.ErrInvalid, in.spec.Name, e.Type())
	}
	k, _ := events.Lookup(e.Type())
	if k.KeyInSubject && !endsInToken(subject, e.Subject()) {
		return fmt.Errorf("%w: NATS subject %q does not end in the event's key %q", events.ErrInvalid, subject, e.Subject())
	}
	return nil
}

// endsInToken reports whether subject ends in "." + token, without building
// that string for every event.
func endsInToken(subject, token string) bool {
	rest, ok := strings.CutSuffix(subject, token)
	return ok && strings.HasSuffix(rest, ".")
}
