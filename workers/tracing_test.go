package workers_test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/tracing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// otlpReceiver is an in-process OTLP/HTTP trace receiver: what a collector
// would be given.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.URL.Path != "/v1/traces" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var export coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &export); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range export.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Write(out)
}

func (r *otlpReceiver) inTrace(traceID string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			out = append(out, s)
		}
	}
	return out
}

// TestATraceFromAPlainNATSPublisherReachesTheOutcome publishes an event
// the way the nats CLI would, with a ce-traceparent header, through a
// worker whose spans go to an OTLP/HTTP receiver configured only by the
// OTEL_* environment. The worker's span is in that trace, a child of the
// publisher's span, and the outcome continues it.
func TestATraceFromAPlainNATSPublisherReachesTheOutcome(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "steward-test")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	if !tracing.Enabled() {
		t.Fatal("an OTLP endpoint in the environment does not enable tracing")
	}
	tp, err := tracing.NewProvider(context.Background(), "steward-test")
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())

	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	r := workertest.Start(t, js, spec("trace"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return d.Emit(ctx, "applied", map[string]string{"hive": d.Key})
	}), workers.WithTracerProvider(tp))

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	const secret = "-----BEGIN AGE ENCRYPTED FILE-----\nc2VjcmV0LXZhbHVl\n-----END AGE ENCRYPTED FILE-----\n"
	m := nats.NewMsg("steward.events.credential.rotated.hive-t")
	for k, v := range map[string]string{
		"ce-specversion": "1.0", "ce-type": events.TypeCredentialRotated, "ce-source": "/cli", "ce-id": "rot-traced",
		"ce-subject": "hive-t", "content-type": "application/json",
		"ce-traceparent": "00-" + traceID + "-" + parentID + "-01",
	} {
		m.Header.Set(k, v)
	}
	m.Data = []byte(`{"hive":"hive-t","version":1,"clientId":"c-1","secret":` + strings.ReplaceAll(`"`+secret+`"`, "\n", `\n`) + `}`)
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	workertest.WaitIdle(t, js, r.ConsumerName())

	var span *tracepb.Span
	workertest.WaitUntil(t, "the collector has the worker's span in the publisher's trace", func() bool {
		_ = tp.ForceFlush(context.Background())
		for _, s := range recv.inTrace(traceID) {
			if s.Name == "process "+r.ConsumerName() {
				span = s
			}
		}
		return span != nil
	})
	if got := hex.EncodeToString(span.ParentSpanId); got != parentID {
		t.Errorf("the worker's span has parent %s, want the publisher's span %s", got, parentID)
	}
	if span.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Errorf("span kind %v, want consumer", span.Kind)
	}
	attrs := map[string]string{}
	for _, a := range span.Attributes {
		attrs[a.Key] = a.Value.String()
	}
	for _, k := range []string{"cloudevents.event_id", "cloudevents.event_type", "messaging.system", "messaging.destination.name", "steward.key", "steward.stream.sequence", "steward.attempt", "steward.result"} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("span lacks attribute %s (has %v)", k, attrs)
		}
	}
	for k, v := range attrs {
		if strings.Contains(v, "c2VjcmV0") {
			t.Errorf("span attribute %s holds the secret", k)
		}
	}

	outs := workertest.Outcomes(t, js, testWorker, "trace")
	if len(outs) != 1 {
		t.Fatalf("%d outcomes, want 1", len(outs))
	}
	want := "00-" + traceID + "-" + hex.EncodeToString(span.SpanId) + "-01"
	if got, _ := outs[0].Extensions()["traceparent"].(string); got != want {
		t.Errorf("the outcome's traceparent is %q, want %q (the worker's span, in the publisher's trace)", got, want)
	}
}

func TestTracingIsOffWhenTheEnvironmentAsksForNothing(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	if tracing.Enabled() {
		t.Fatal("tracing is on with no OTEL_* setting")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	if tracing.Enabled() {
		t.Fatal("OTEL_SDK_DISABLED=true does not turn tracing off")
	}
}
