// Package publisher puts Steward events on JetStream: it validates them,
// fills what a caller may leave empty, and publishes with the event id as
// JetStream's dedupe id. Ingress serves the same over HTTP for consoles.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/tracing"
)

// DefaultSource is the CloudEvents source of events whose publisher named none.
const DefaultSource = "/steward/publisher"

// Publisher publishes Steward events. It is safe for concurrent use.
type Publisher struct {
	js      jetstream.JetStream
	source  string
	tracer  trace.Tracer
	refused *prometheus.CounterVec
}

// Option configures a Publisher.
type Option func(*Publisher)

// WithTracerProvider sets where publish spans go; the default is the
// global provider (internal/tracing sets it from the OTEL_* environment).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(p *Publisher) { p.tracer = tp.Tracer(tracing.Scope) }
}

// WithRegisterer registers steward_publish_refused_total{stream,limit}:
// events a stream refused because one of its limits was reached.
func WithRegisterer(r prometheus.Registerer) Option {
	return func(p *Publisher) {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "steward_publish_refused_total",
			Help: "Events a stream refused because it reached a limit (max_bytes, max_msg_size, ...): nothing stored was dropped.",
		}, []string{"stream", "limit"})
		if err := r.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				c, _ = are.ExistingCollector.(*prometheus.CounterVec)
			}
		}
		p.refused = c
	}
}

// RefusedCounter is steward_publish_refused_total, when WithRegisterer
// registered it (nil otherwise).
func (p *Publisher) RefusedCounter() *prometheus.CounterVec { return p.refused }

// WithSource sets the source given to events that carry none.
func WithSource(source string) Option { return func(p *Publisher) { p.source = source } }

// New returns a Publisher on js. The streams must exist (events.EnsureStreams).
func New(js jetstream.JetStream, opts ...Option) *Publisher {
	p := &Publisher{js: js, source: DefaultSource, tracer: otel.GetTracerProvider().Tracer(tracing.Scope)}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Ack says where an event was stored.
type Ack struct {
	// ID is the event id, as filled in when the caller left it empty.
	ID string `json:"id"`
	// Stream and Sequence locate the stored event.
	Stream   string `json:"stream"`
	Sequence uint64 `json:"sequence"`
	// Duplicate is true when JetStream already held an event with this id
	// inside its dedupe window and stored nothing new.
	Duplicate bool `json:"duplicate"`
}

// Prepare fills what a caller may leave empty (id, time, source, and the
// subject attribute from the data's key field) and validates the event. It
// returns the NATS subject the event belongs on.
func (p *Publisher) Prepare(e *event.Event) (string, error) {
	if e.ID() == "" {
		e.SetID(ulid.Make().String())
	}
	if e.Time().IsZero() {
		e.SetTime(time.Now().UTC())
	}
	if e.Source() == "" {
		e.SetSource(p.source)
	}
	if e.DataContentType() == "" {
		e.SetDataContentType(events.ContentTypeJSON)
	}
	if e.Subject() == "" {
		if key, err := events.KeyOf(e.Type(), e.Data()); err == nil {
			e.SetSubject(key)
		}
	}
	if err := events.Validate(*e); err != nil {
		return "", fmt.Errorf("event %s: %w", e.ID(), err)
	}
	k, _ := events.Lookup(e.Type())
	return k.SubjectFor(e.Subject())
}

// Publish validates e, fills its empty id, time and source, and stores it in
// STEWARD_EVENTS. A validation failure wraps events.ErrInvalid and nothing is
// published.
func (p *Publisher) Publish(ctx context.Context, e event.Event) (Ack, error) {
	subject, err := p.Prepare(&e)
	if err != nil {
		return Ack{}, err
	}
	// The event carries its trace (the CloudEvents tracing extension):
	// one the publisher's caller set is continued, else the caller's
	// span, so a console's trace reaches the worker and its outcome.
	parent := ctx
	if tracing.TraceID(e) != "" {
		parent = tracing.Extract(ctx, &e)
	}
	ctx, span := p.tracer.Start(parent, "publish "+subject, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.EventAttributes(e)...),
		trace.WithAttributes(attribute.String("messaging.system", "nats"), attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", subject)))
	defer span.End()
	tracing.Inject(ctx, &e)
	msg, err := events.Encode(subject, e)
	if err != nil {
		return Ack{}, err
	}
	pa, err := p.js.PublishMsg(ctx, msg)
	if le := events.AsLimitError(events.StreamEvents, err, nil); le != nil {
		// The stream discards new events at its limits, so what it holds
		// is never dropped; the publisher hears why and what raises it.
		span.SetStatus(codes.Error, "refused at a limit")
		if p.refused != nil {
			p.refused.WithLabelValues(le.Stream, le.Limit).Inc()
		}
		return Ack{ID: e.ID()}, fmt.Errorf("publish %s for %s (event %s): %w", e.Type(), e.Subject(), e.ID(), le)
	}
	if err != nil {
		span.SetStatus(codes.Error, "not stored")
		return Ack{ID: e.ID()}, fmt.Errorf("publish %s for %s (event %s): %w", e.Type(), e.Subject(), e.ID(), err)
	}
	return Ack{ID: e.ID(), Stream: pa.Stream, Sequence: pa.Sequence, Duplicate: pa.Duplicate}, nil
}

// IsInvalid reports whether err is a validation failure, which no retry fixes.
func IsInvalid(err error) bool { return errors.Is(err, events.ErrInvalid) }
