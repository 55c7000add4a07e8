package workers_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

func TestABurstForOneKeyAppliesTheNewestOnce(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const burst = 1000
	for v := uint64(1); v <= burst; v++ {
		publishRotation(t, js, "hive-burst", v)
	}
	var mu sync.Mutex
	var applied []uint64
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, latestSpec("burst"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		mu.Lock()
		applied = append(applied, versionOf(t, d))
		mu.Unlock()
		return d.Emit(ctx, "applied", nil)
	}), workers.WithRegisterer(reg))
	workertest.WaitIdle(t, js, r.ConsumerName())

	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 1 || applied[0] != burst {
		t.Fatalf("applied %v, want only version %d", applied, burst)
	}
	got := outcomeTypes(t, js, "burst")
	if got["superseded"] != burst-1 || got["applied"] != 1 {
		t.Fatalf("outcomes %v, want %d superseded and 1 applied", got, burst-1)
	}
	if n := counter(t, reg, "superseded"); n != burst-1 {
		t.Fatalf("steward_events_total{result=superseded} = %v, want %d", n, burst-1)
	}
	if dls := workertest.DeadLetters(t, js, testWorker, "burst"); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none", len(dls))
	}
}

// TestAnEventAppliedByAWorkerKilledBeforeItsCheckpointKeepsItsOutcome kills
// a worker after its handler applied version 1 and emitted "applied", before
// the checkpoint recorded it; version 2 is published meanwhile. The next
// worker gets version 1 back behind version 2 and supersedes it without
// knowing it was applied. The history must still say what happened, once:
// version 1 applied, version 2 applied, no "superseded" after "applied".
func TestAnEventAppliedByAWorkerKilledBeforeItsCheckpointKeepsItsOutcome(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const ackWait = 500 * time.Millisecond
	sp := latestSpec("killed-after-apply")
	dieHoldingAfter(t, srv, sp, ackWait, func() { publishRotation(t, js, "hive-k", 1) },
		func(ctx context.Context, d *workers.Delivery) error { return d.Emit(ctx, "applied", nil) })
	publishRotation(t, js, "hive-k", 2)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	var logs workertest.Logs
	r := workertest.Start(t, js, sp, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return d.Emit(ctx, "applied", nil)
	}), workers.WithAckWait(ackWait), workers.WithRegisterer(reg), workers.WithLogger(zerolog.New(&logs)))
	workertest.WaitIdle(t, js, r.ConsumerName())

	if rec.count(1) != 0 || rec.count(2) != 1 {
		t.Fatalf("the second worker handled version 1 %d times and version 2 %d times; want 0 (superseded) and 1", rec.count(1), rec.count(2))
	}
	if n := counter(t, reg, "superseded"); n != 1 {
		t.Fatalf("steward_events_total{result=superseded} = %v, want 1 (version 1 settled as superseded)", n)
	}
	byEvent := map[string][]string{}
	for _, o := range workertest.Outcomes(t, js, testWorker, "killed-after-apply") {
		cause, _ := o.Extensions()["causationid"].(string)
		byEvent[cause] = append(byEvent[cause], o.ID()+" "+strings.TrimSuffix(strings.TrimPrefix(o.Type(), "dev.steward."+testWorker+"."), ".v1"))
	}
	if len(byEvent) != 2 {
		t.Fatalf("outcomes by event %v, want one for each of the 2 events", byEvent)
	}
	for cause, got := range byEvent {
		if len(got) != 1 || !strings.HasSuffix(got[0], " applied") {
			t.Errorf("event %s has outcomes %v, want its one applied", cause, got)
		}
	}
	// The operator is told why no superseded outcome follows.
	if !strings.Contains(logs.String(), "superseded was not stored (an event keeps its first outcome)") {
		t.Errorf("the log does not say the superseded outcome was dropped:\n%s", logs.String())
	}
}

func TestAnUnverifiableHugeVersionSupersedesNothing(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	publishRotation(t, js, "hive-h", 1)
	workertest.PublishData(t, js, events.TypeCredentialRotated, "hive-h", events.CredentialRotated{
		Hive: "hive-h", Version: math.MaxUint64, ClientID: "forged-by-anyone",
		Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n",
	})
	var mu sync.Mutex
	var applied []uint64
	r := workertest.Start(t, js, latestSpec("huge"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var data events.CredentialRotated
		if err := d.DataAs(&data); err != nil {
			return err
		}
		if data.ClientID == "forged-by-anyone" {
			if err := d.Emit(ctx, "refused", map[string]string{"reason": "not signed"}); err != nil {
				return err
			}
			return workers.Refused(errors.New("the rotation is not signed by the controller, so nothing was written"))
		}
		mu.Lock()
		applied = append(applied, data.Version)
		mu.Unlock()
		return d.Emit(ctx, "applied", nil)
	}))
	workertest.WaitIdle(t, js, r.ConsumerName())

	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 1 || applied[0] != 1 {
		t.Fatalf("applied %v, want version 1: a forged version may not supersede it", applied)
	}
	got := outcomeTypes(t, js, "huge")
	if got["superseded"] != 0 || got["refused"] != 1 || got["applied"] != 1 {
		t.Fatalf("outcomes %v, want 1 applied, 1 refused, none superseded", got)
	}
}

func TestARefusalIsAnOutcomeNotADeadLetter(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	reg := prometheus.NewRegistry()
	rec := newRecorder()
	r := workertest.Start(t, js, spec("refuse"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		v := versionOf(t, d)
		rec.record(d.Key, v)
		if v == 1 {
			if err := d.Emit(ctx, "refused", map[string]string{"rule": "downgrade"}); err != nil {
				return err
			}
			return workers.Refused(errors.New("version 1 is older than the installed one, so nothing ran"))
		}
		return d.Emit(ctx, "applied", nil)
	}), workers.WithRegisterer(reg))
	publishRotation(t, js, "hive-r", 1)
	publishRotation(t, js, "hive-r", 2)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if dls := workertest.DeadLetters(t, js, testWorker, "refuse"); len(dls) != 0 {
		t.Fatalf("a refusal was dead-lettered: %+v", dls[0].Reason)
	}
	if rec.count(1) != 1 || rec.count(2) != 1 {
		t.Fatalf("handled v1 %d and v2 %d times, want once each", rec.count(1), rec.count(2))
	}
	if got := counter(t, reg, "refused"); got != 1 {
		t.Fatalf("steward_events_total{result=refused} = %v, want 1", got)
	}
	if got := outcomeTypes(t, js, "refuse"); got["refused"] != 1 || got["applied"] != 1 {
		t.Fatalf("outcomes %v", got)
	}
}

// TestAnInvalidEventRanksNowhere stores, after a valid rotation, one whose
// data its schema refuses (a client id with a space in it) and whose
// version is the largest there is. Validation comes before Rank, which
// would have read that version: the valid rotation is applied, the invalid
// one dead-lettered, and nothing is superseded.
func TestAnInvalidEventRanksNowhere(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	publishRotation(t, js, "hive-i", 1)
	publishRaw(t, js, rawRotation(t, "invalid-huge", "hive-i",
		[]byte(`{"hive":"hive-i","version":18446744073709551615,"clientId":"has space","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"}`)))
	var mu sync.Mutex
	var applied []uint64
	r := workertest.Start(t, js, latestSpec("invalid"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		mu.Lock()
		applied = append(applied, versionOf(t, d))
		mu.Unlock()
		return d.Emit(ctx, "applied", nil)
	}))
	workertest.WaitIdle(t, js, r.ConsumerName())

	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 1 || applied[0] != 1 {
		t.Fatalf("applied %v, want version 1 only", applied)
	}
	if got := outcomeTypes(t, js, "invalid"); got["superseded"] != 0 || got["applied"] != 1 {
		t.Fatalf("outcomes %v, want 1 applied and none superseded", got)
	}
	letters := workertest.DeadLetters(t, js, testWorker, "invalid")
	if len(letters) != 1 || !strings.Contains(letters[0].Reason, "/clientId") {
		t.Fatalf("dead letters %+v, want the invalid rotation's, naming /clientId", letters)
	}
}

// TestSupersededEventsHaveSupersedeSpans proves each event superseded
// gets a consumer span of its own, named for settling it as superseded,
// and the one applied its process span: the names are made once per
// instance, and swapping them would go unseen without this.
func TestSupersededEventsHaveSupersedeSpans(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for v := uint64(1); v <= 3; v++ {
		publishRotation(t, js, "hive-spans", v)
	}
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	r := workertest.Start(t, js, latestSpec("spans"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return d.Emit(ctx, "applied", nil)
	}), workers.WithTracerProvider(tp))
	workertest.WaitIdle(t, js, r.ConsumerName())

	names := map[string]int{}
	for _, s := range spans.Ended() {
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q is of kind %v, want consumer", s.Name(), s.SpanKind())
		}
		// A span's name and its messaging operation must agree.
		op := ""
		for _, a := range s.Attributes() {
			if a.Key == "messaging.operation.name" {
				op = a.Value.AsString()
			}
		}
		names[s.Name()+" ("+op+")"]++
	}
	if names["supersede "+r.ConsumerName()+" (supersede)"] != 2 || names["process "+r.ConsumerName()+" (process)"] != 1 {
		t.Fatalf("spans %v, want 2 supersede and 1 process spans of %s, each with its operation", names, r.ConsumerName())
	}
}
