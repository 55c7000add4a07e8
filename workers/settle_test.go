package workers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

func TestSuccessIsAckedWithConfirmation(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, spec("ack"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return d.Emit(ctx, "applied", map[string]uint64{"version": versionOf(t, d)})
	}), workers.WithRegisterer(reg))
	for v := uint64(1); v <= 3; v++ {
		publishRotation(t, js, "hive-a", v)
	}
	workertest.WaitIdle(t, js, r.ConsumerName())
	for v := uint64(1); v <= 3; v++ {
		if rec.count(v) != 1 {
			t.Errorf("version %d handled %d times, want 1", v, rec.count(v))
		}
	}
	if info := consumerInfo(t, js, r.ConsumerName()); info.AckFloor.Stream != 3 || info.NumRedelivered != 0 {
		t.Fatalf("ack floor %d, redelivered %d; want 3 and 0", info.AckFloor.Stream, info.NumRedelivered)
	}
	if got := len(workertest.Outcomes(t, js, testWorker, "ack")); got != 3 {
		t.Fatalf("%d outcomes, want 3", got)
	}
	if got := counter(t, reg, "applied"); got != 3 {
		t.Fatalf("applied metric %v, want 3", got)
	}
}

func TestPermanentErrorReachesTheDLQOnFirstDeliveryWithHeaders(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	r := workertest.Start(t, js, spec("perm"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return workers.Permanent(fmt.Errorf("the rotation for %s is refused by policy", d.Key))
	}), fastRetries())
	ack := publishRotation(t, js, "hive-p", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if rec.count(1) != 1 {
		t.Fatalf("handled %d times, want exactly 1 (no retry of a permanent error)", rec.count(1))
	}
	dls := workertest.DeadLetters(t, js, testWorker, "perm")
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if !strings.Contains(dl.Reason, "refused by policy") || dl.Delivered != 1 || dl.Sequence != ack.Sequence {
		t.Fatalf("dead letter reason %q, deliveries %d, seq %d", dl.Reason, dl.Delivered, dl.Sequence)
	}
	if dl.Headers.Get(events.HeaderWorker) != "rt-perm" || dl.Headers.Get(events.HeaderSubject) != "steward.events.credential.rotated.hive-p" {
		t.Fatalf("dead letter headers: %v", dl.Headers)
	}
	if dl.Event == nil || dl.Event.ID() != ack.ID || dl.Headers.Get("ce-type") != events.TypeCredentialRotated {
		t.Fatalf("the original event is not in the dead letter: %+v", dl.Event)
	}
}

func TestADeadLetterDoesNotHoldUpItsKey(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const ackWait = 500 * time.Millisecond
	// Version 1 is refused; a worker that dies holding version 2 and a new
	// worker for version 3 must not wait on version 1, which is settled.
	refuseFirst := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return workers.Permanent(errors.New("refused"))
	})
	first := workertest.Start(t, js, spec("dlqorder"), refuseFirst)
	publishRotation(t, js, "hive-d", 1)
	workertest.WaitIdle(t, js, first.ConsumerName())
	first.Stop()
	rec := newRecorder()
	publishRotation(t, js, "hive-d", 2)
	b := workertest.Start(t, js, spec("dlqorder"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}), workers.WithAckWait(ackWait))
	workertest.WaitIdle(t, js, b.ConsumerName())
	if got := strings.Join(rec.order, " "); got != "hive-d:2" {
		t.Fatalf("handled %q, want only version 2", got)
	}
}

func TestInvalidEventsGoToTheDLQAtOnce(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var calls atomic.Int32
	r := workertest.Start(t, js, spec("invalid"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		calls.Add(1)
		return nil
	}))
	raw := func(subject string, h map[string]string, data string) {
		msg := nats.NewMsg(subject)
		for k, v := range h {
			msg.Header.Set(k, v)
		}
		msg.Data = []byte(data)
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	base := func(typ, subject string) map[string]string {
		return map[string]string{"ce-specversion": "1.0", "ce-id": "id-" + typ + subject, "ce-source": "/attacker", "ce-type": typ, "ce-subject": subject, "content-type": "application/json"}
	}
	good := `{"hive":"h1","version":1,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx"}`
	raw("steward.events.credential.rotated.h1", map[string]string{"content-type": "application/json"}, good)
	raw("steward.events.credential.rotated.h1", base("dev.steward.credential.deleted.v1", "h1"), good)
	raw("steward.events.credential.rotated.h1", base(events.TypeCredentialRotated, "h1"), `{"hive":"h1",`)
	raw("steward.events.credential.rotated.h1", base(events.TypeCredentialRotated, "h1"), `{"hive":"h1","version":1,"clientId":"c","secret":"-----BEGIN AGE ENCRYPTED FILE-----\nx","admin":true}`)
	raw("steward.events.credential.rotated.h1", base(events.TypeCredentialRotated, "h2"), good)
	raw("steward.events.credential.rotated.h2", base(events.TypeCredentialRotated, "h1"), good)
	raw("steward.events.credential.rotated.h1", base(events.TypeGrantChanged, "h1"), `{"machine":"h1","requirement":"postgres","generation":1,"given":[]}`)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if calls.Load() != 0 {
		t.Fatalf("the handler saw %d invalid events", calls.Load())
	}
	dls := workertest.DeadLetters(t, js, testWorker, "invalid")
	wants := []string{
		"not a CloudEvent",
		"not a Steward event type",
		"not valid JSON",
		"admin",
		"subject attribute \"h2\"",
		"does not end in the event's key",
		"does not handle type",
	}
	if len(dls) != len(wants) {
		t.Fatalf("%d dead letters, want %d", len(dls), len(wants))
	}
	// Invalid events are dead-lettered in parallel, so match reasons as a set.
	for _, w := range wants {
		found := false
		for _, dl := range dls {
			found = found || (strings.Contains(dl.Reason, w) && dl.Delivered == 1)
		}
		if !found {
			t.Errorf("no dead letter on the first delivery names %q", w)
		}
	}
}
