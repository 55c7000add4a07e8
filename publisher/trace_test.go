package publisher_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/tracing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestPublishCarriesTheTrace proves an event published by Steward carries
// the trace its caller is in (the CloudEvents tracing extension), and that
// an event that already carries one keeps its trace.
func TestPublishCarriesTheTrace(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	p := publisher.New(js, publisher.WithTracerProvider(tp))

	ctx, caller := tp.Tracer("console").Start(context.Background(), "console click")
	e, err := events.New(events.TypeReleasePublished, "1.2.0", events.ReleasePublished{Version: "1.2.0"})
	if err != nil {
		t.Fatal(err)
	}
	ack, err := p.Publish(ctx, e)
	caller.End()
	if err != nil {
		t.Fatal(err)
	}
	stored := storedEvent(t, js, ack.Sequence)
	if got, want := tracing.TraceID(stored), caller.SpanContext().TraceID().String(); got != want {
		t.Fatalf("the stored event is in trace %q, want the caller's %q", got, want)
	}
	if n := len(rec.Ended()); n != 2 {
		t.Fatalf("%d spans ended, want the caller's and the publish span", n)
	}

	const given = "0af7651916cd43dd8448eb211c80319c"
	e2, _ := events.New(events.TypeReleasePublished, "1.3.0", events.ReleasePublished{Version: "1.3.0"})
	e2.SetExtension("traceparent", "00-"+given+"-b7ad6b7169203331-01")
	ack2, err := p.Publish(context.Background(), e2)
	if err != nil {
		t.Fatal(err)
	}
	if got := tracing.TraceID(storedEvent(t, js, ack2.Sequence)); got != given {
		t.Fatalf("an event published with a traceparent left its trace: %q, want %q", got, given)
	}
}

func storedEvent(t *testing.T, js jetstream.JetStream, seq uint64) event.Event {
	t.Helper()
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(context.Background(), seq)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
