// Package tracing connects Steward to OpenTelemetry. It is configured only
// by the standard OTEL_* environment (OTEL_EXPORTER_OTLP_ENDPOINT,
// OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER,
// OTEL_BSP_*, ...), and is off when none of it asks for an exporter, so a
// process that nobody traces pays for a no-op tracer only.
//
// A trace crosses the bus in the event itself, as the CloudEvents
// distributed-tracing extension says: the W3C trace context in the
// `traceparent` and `tracestate` extension attributes (`ce-traceparent` in
// binary mode), so an event published by any client that sets them (the
// nats CLI included) continues its publisher's trace.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
)

// Scope is the instrumentation scope of Steward's spans.
const Scope = "github.com/steward-dev/steward"

// EventAttributes are the CloudEvents semantic-convention attributes of e.
// None of them is a secret: ids, types, sources and keys only.
func EventAttributes(e event.Event) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("cloudevents.event_id", e.ID()),
		attribute.String("cloudevents.event_source", e.Source()),
		attribute.String("cloudevents.event_spec_version", e.SpecVersion()),
		attribute.String("cloudevents.event_type", e.Type()),
		attribute.String("cloudevents.event_subject", e.Subject()),
	}
}

// Enabled reports whether the environment asks for traces to be exported:
// an OTLP endpoint is set, or OTEL_TRACES_EXPORTER is otlp, and neither
// OTEL_SDK_DISABLED nor OTEL_TRACES_EXPORTER=none says otherwise.
func Enabled() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// NewProvider builds a TracerProvider exporting over OTLP as the
// environment says (protocol http/protobuf by default, or grpc), batching
// as OTEL_BSP_* says and sampling as OTEL_TRACES_SAMPLER says. service
// names the process unless OTEL_SERVICE_NAME does.
func NewProvider(ctx context.Context, service string) (*sdktrace.TracerProvider, error) {
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want http/protobuf or grpc (http/json is not supported by the Go exporters)", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName(service)),
		// The environment wins: OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES.
		resource.Environment(),
	)
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// Setup installs the global TracerProvider when the environment asks for
// traces, and returns what flushes and stops it; otherwise it changes
// nothing and returns a no-op.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	if !Enabled() {
		return func(context.Context) error { return nil }, nil
	}
	tp, err := NewProvider(ctx, service)
	if err != nil {
		return nil, err
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp.Shutdown, nil
}

// traceContext is the propagator of the CloudEvents tracing extension: W3C
// trace context, whatever OTEL_PROPAGATORS says for other carriers.
var traceContext = propagation.TraceContext{}

// eventCarrier is a TextMapCarrier over a CloudEvent's extension
// attributes.
type eventCarrier struct{ e *event.Event }

func (c eventCarrier) Get(key string) string {
	v, ok := c.e.Extensions()[key]
	if !ok {
		return ""
	}
	s, _ := v.(string)
	return s
}

func (c eventCarrier) Set(key, value string) { c.e.SetExtension(key, value) }

func (c eventCarrier) Keys() []string {
	var keys []string
	for k := range c.e.Extensions() {
		keys = append(keys, k)
	}
	return keys
}

// Extract returns ctx carrying the trace context of e's traceparent and
// tracestate, when it has them.
//
// It takes the event by reference so that reading its trace costs no
// allocation: every delivery's span starts from it.
func Extract(ctx context.Context, e *event.Event) context.Context {
	return traceContext.Extract(ctx, eventCarrier{e})
}

// Inject sets e's traceparent and tracestate to the span in ctx, when there
// is one that is recording or sampled; an event without a trace is left as
// it is.
func Inject(ctx context.Context, e *event.Event) {
	traceContext.Inject(ctx, eventCarrier{e})
}

// TraceID returns the trace id of e's traceparent, or "".
func TraceID(e event.Event) string {
	parts := strings.Split(eventCarrier{&e}.Get("traceparent"), "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}
