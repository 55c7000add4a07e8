package workers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// The runtime is tested with credential.rotated events on a test worker:
// the hive is the key, the version tells events apart.
const testWorker = "rt"

func spec(instance string) workers.Spec {
	return workers.Spec{
		Name:     testWorker,
		Instance: instance,
		Subjects: []string{"steward.events.credential.rotated.>"},
		Types:    []string{events.TypeCredentialRotated},
	}
}

func publishRotation(t testing.TB, js jetstream.JetStream, hive string, version uint64) publisher.Ack {
	t.Helper()
	return workertest.PublishData(t, js, events.TypeCredentialRotated, hive, events.CredentialRotated{
		Hive: hive, Version: version, ClientID: "client-" + strconv.FormatUint(version, 10),
		Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nnot-a-real-secret\n-----END AGE ENCRYPTED FILE-----\n",
	})
}

func versionOf(t testing.TB, d *workers.Delivery) uint64 {
	var data events.CredentialRotated
	if err := d.DataAs(&data); err != nil {
		t.Error(err)
	}
	return data.Version
}

// fastRetries keeps retry delays short so tests finish quickly.
func fastRetries() workers.Option {
	return workers.WithBackoff(func() backoff.BackOff { return backoff.NewConstantBackOff(50 * time.Millisecond) })
}

// recorder counts handler calls per version and remembers their order.
type recorder struct {
	mu    sync.Mutex
	calls map[uint64]int
	order []string
}

func newRecorder() *recorder { return &recorder{calls: map[uint64]int{}} }

func (r *recorder) record(key string, v uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[v]++
	r.order = append(r.order, key+":"+strconv.FormatUint(v, 10))
	return r.calls[v]
}

func (r *recorder) count(v uint64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[v]
}

func consumerInfo(t testing.TB, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	c, err := js.Consumer(context.Background(), publisher.StreamEvents, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

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

// counter finds steward_events_total for the result in a registry.
func counter(t testing.TB, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, f := range families {
		if f.GetName() != "steward_events_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					v += m.GetCounter().GetValue()
				}
			}
		}
	}
	return v
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
	if dl.Headers.Get(workers.HeaderWorker) != "rt-perm" || dl.Headers.Get(workers.HeaderSubject) != "steward.events.credential.rotated.hive-p" {
		t.Fatalf("dead letter headers: %v", dl.Headers)
	}
	if dl.Event == nil || dl.Event.ID() != ack.ID || dl.Headers.Get("ce-type") != events.TypeCredentialRotated {
		t.Fatalf("the original event is not in the dead letter: %+v", dl.Event)
	}
}

func TestFailingTwiceThenSucceedingIsAckedOnce(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, spec("flaky"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if n := rec.record(d.Key, versionOf(t, d)); n <= 2 {
			return fmt.Errorf("dependency unavailable (attempt %d)", d.Attempt)
		}
		return d.Emit(ctx, "applied", nil)
	}), fastRetries(), workers.WithRegisterer(reg))
	publishRotation(t, js, "hive-f", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if rec.count(1) != 3 {
		t.Fatalf("handled %d times, want 3", rec.count(1))
	}
	if got := counter(t, reg, "applied"); got != 1 {
		t.Fatalf("acked %v times, want 1", got)
	}
	if got := counter(t, reg, "retried"); got != 2 {
		t.Fatalf("retried %v times, want 2", got)
	}
	if len(workertest.DeadLetters(t, js, testWorker, "flaky")) != 0 {
		t.Fatal("a recovered event reached the DLQ")
	}
	if got := len(workertest.Outcomes(t, js, testWorker, "flaky")); got != 1 {
		t.Fatalf("%d outcomes, want 1", got)
	}
}

func TestRetriesExhaustedReachTheDLQ(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	r := workertest.Start(t, js, spec("exhaust"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return errors.New("database is down")
	}), fastRetries(), workers.WithMaxDeliver(3))
	publishRotation(t, js, "hive-x", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if rec.count(1) != 3 {
		t.Fatalf("handled %d times, want MaxDeliver = 3", rec.count(1))
	}
	dls := workertest.DeadLetters(t, js, testWorker, "exhaust")
	if len(dls) != 1 || dls[0].Delivered != 3 || !strings.Contains(dls[0].Reason, "failed 3 deliveries") || !strings.Contains(dls[0].Reason, "database is down") {
		t.Fatalf("dead letters: %+v", dls)
	}
}

func TestPanicIsCaughtAndRetried(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, spec("panic"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if rec.record(d.Key, versionOf(t, d)) == 1 {
			var m map[string]int
			m["boom"]++ // a nil map write: a real panic
		}
		return nil
	}), fastRetries(), workers.WithRegisterer(reg))
	publishRotation(t, js, "hive-panic", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	if rec.count(1) != 2 {
		t.Fatalf("handled %d times, want 2 (panic, then success)", rec.count(1))
	}
	if r.Ready() != nil {
		t.Fatal("the worker died with the panic")
	}
	families, _ := reg.Gather()
	found := false
	for _, f := range families {
		if f.GetName() == "steward_handler_panics_total" && f.GetMetric()[0].GetCounter().GetValue() == 1 {
			found = true
		}
	}
	if !found {
		t.Fatal("the panic was not counted")
	}
}

func TestHandlerRunningThreeTimesAckWaitIsNotRedelivered(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const ackWait = 500 * time.Millisecond
	rec := newRecorder()
	r := workertest.Start(t, js, spec("long"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		// The work itself takes three AckWaits; heartbeats must cover it.
		select {
		case <-time.After(3 * ackWait):
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}), workers.WithAckWait(ackWait), fastRetries())
	publishRotation(t, js, "hive-long", 1)
	publishRotation(t, js, "hive-long", 2) // queued behind the first for 3 AckWaits
	workertest.WaitIdle(t, js, r.ConsumerName())
	if rec.count(1) != 1 || rec.count(2) != 1 {
		t.Fatalf("handled %d and %d times, want 1 and 1", rec.count(1), rec.count(2))
	}
	if info := consumerInfo(t, js, r.ConsumerName()); info.NumRedelivered != 0 {
		t.Fatalf("%d redelivered, want 0", info.NumRedelivered)
	}
}

func TestKilledWorkerIsResumedFromTheSavedStage(t *testing.T) {
	srv := workertest.StartServer(t)
	const ackWait = 500 * time.Millisecond

	// The first worker saves a stage and then hangs, as a process does
	// when it is killed mid-handler; its connection is then closed.
	ncA := srv.Connect(t)
	jsA, _ := jetstream.New(ncA)
	started := make(chan struct{})
	hang := make(chan struct{})
	defer close(hang)
	a := workertest.Start(t, jsA, spec("resume"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if err := d.SaveStage(ctx, map[string]string{"stage": "job-ensured", "execution": "exec-1"}); err != nil {
			return err
		}
		close(started)
		<-hang
		return errors.New("killed")
	}), workers.WithAckWait(ackWait), workers.WithShutdownGrace(time.Millisecond))
	js := srv.JetStream(t)
	publishRotation(t, js, "hive-r", 1)
	<-started
	ncA.Close()
	_ = a

	var resumedFrom atomic.Value
	var calls atomic.Int32
	b := workertest.Start(t, js, spec("resume"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		calls.Add(1)
		var stage map[string]string
		ok, err := d.LoadStage(&stage)
		if err != nil {
			return err
		}
		if ok {
			resumedFrom.Store(stage["stage"] + "/" + stage["execution"])
		}
		return nil
	}), workers.WithAckWait(ackWait))
	workertest.WaitIdle(t, js, b.ConsumerName())
	if got, _ := resumedFrom.Load().(string); got != "job-ensured/exec-1" || calls.Load() != 1 {
		t.Fatalf("resumed from %q in %d calls, want job-ensured/exec-1 in 1", got, calls.Load())
	}
}

// dieHolding starts a worker on its own connection whose handler takes the
// first event it gets and hangs, as a process killed mid-handler does, then
// closes that connection. It returns once the event is held and the
// connection is gone: the server redelivers the event only after AckWait.
func dieHolding(t *testing.T, srv *workertest.Server, sp workers.Spec, ackWait time.Duration, publish func()) {
	t.Helper()
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	var once sync.Once
	workertest.Start(t, js, sp, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		once.Do(func() { close(started) })
		select {
		case <-hang:
		case <-ctx.Done():
		}
		return errors.New("killed")
	}), workers.WithAckWait(ackWait), workers.WithShutdownGrace(time.Millisecond))
	publish()
	<-started
	nc.Close()
	// Until the server drops the dead connection's pull requests, it could
	// still hand that connection the next event.
	observer := srv.JetStream(t)
	workertest.WaitUntil(t, "the dead worker's pull requests are gone", func() bool {
		return consumerInfo(t, observer, sp.Name+"-"+sp.Instance).NumWaiting == 0
	})
}

func TestAnEventHeldByADeadWorkerIsHandledBeforeLaterOnesOfItsKey(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const ackWait = 500 * time.Millisecond

	// Worker A takes version 1 and dies holding it; version 2 is published
	// after, so a new worker gets it at once and version 1 only after
	// AckWait. Version 1 must still come first.
	dieHolding(t, srv, spec("crashorder"), ackWait, func() { publishRotation(t, js, "hive-c", 1) })
	publishRotation(t, js, "hive-c", 2)
	rec := newRecorder()
	var attempts sync.Map
	b := workertest.Start(t, js, spec("crashorder"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		v := versionOf(t, d)
		rec.record(d.Key, v)
		attempts.Store(v, d.Attempt)
		return nil
	}), workers.WithAckWait(ackWait))
	workertest.WaitIdle(t, js, b.ConsumerName())
	if got := strings.Join(rec.order, " "); got != "hive-c:1 hive-c:2" {
		t.Fatalf("handled %q, want version 1 then version 2", got)
	}
	// Version 2 waited while held: the wait cost it no delivery.
	if a1, _ := attempts.Load(uint64(1)); a1 != uint64(2) {
		t.Errorf("version 1 handled on attempt %v, want 2 (the dead worker had the first)", a1)
	}
	if a2, _ := attempts.Load(uint64(2)); a2 != uint64(1) {
		t.Errorf("version 2 handled on attempt %v, want 1", a2)
	}
}

func TestOldEventRedeliveredAfterANewerOneIsSkipped(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	// Long enough that the new worker surely takes version 2 before the
	// dead worker's version 1 comes back.
	const ackWait = 2 * time.Second

	// One order key over every hive's subject: an earlier event on another
	// subject is not looked for, so here the newer event is applied first
	// and the checkpoint alone must keep the key from rolling back.
	sp := spec("stale")
	sp.OrderKey = func(event.Event) string { return "all-hives" }
	dieHolding(t, srv, sp, ackWait, func() { publishRotation(t, js, "hive-s1", 1) })
	publishRotation(t, js, "hive-s2", 2)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	b := workertest.Start(t, js, sp, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}), workers.WithAckWait(ackWait), workers.WithRegisterer(reg))
	workertest.WaitIdle(t, js, b.ConsumerName())
	if rec.count(2) != 1 || rec.count(1) != 0 {
		t.Fatalf("version 2 handled %d times, version 1 %d times; want 1 and 0", rec.count(2), rec.count(1))
	}
	if got := counter(t, reg, "skipped"); got != 1 {
		t.Fatalf("skipped %v, want 1", got)
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

func TestSameKeyInOrderDifferentKeysInParallel(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	const perKey = 20
	// Publish first, so the worker sees a backlog of both keys at once.
	for v := uint64(1); v <= perKey; v++ {
		publishRotation(t, js, "hive-1", v)
		publishRotation(t, js, "hive-2", v)
	}
	var mu sync.Mutex
	seen := map[string][]uint64{}
	running := map[string]bool{}
	overlapped := make(chan struct{})
	var once sync.Once
	r := workertest.Start(t, js, spec("order"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		v := versionOf(t, d)
		mu.Lock()
		if running[d.Key] {
			mu.Unlock()
			return workers.Permanent(fmt.Errorf("two events of %s ran at once", d.Key))
		}
		running[d.Key] = true
		seen[d.Key] = append(seen[d.Key], v)
		if running["hive-1"] && running["hive-2"] {
			once.Do(func() { close(overlapped) })
		}
		mu.Unlock()
		if v == 1 {
			// Both keys' first events wait for each other: only parallel
			// lanes get past this.
			select {
			case <-overlapped:
			case <-ctx.Done():
			}
		}
		mu.Lock()
		running[d.Key] = false
		mu.Unlock()
		return nil
	}), workers.WithConcurrency(2))
	workertest.WaitIdle(t, js, r.ConsumerName())
	for _, key := range []string{"hive-1", "hive-2"} {
		if len(seen[key]) != perKey {
			t.Fatalf("%s: handled %d events, want %d", key, len(seen[key]), perKey)
		}
		for i, v := range seen[key] {
			if v != uint64(i+1) {
				t.Fatalf("%s handled out of order: %v", key, seen[key])
			}
		}
	}
	if dls := workertest.DeadLetters(t, js, testWorker, "order"); len(dls) != 0 {
		t.Fatalf("dead letters: %s", dls[0].Reason)
	}
}

func TestOrderHoldsAcrossRetries(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for v := uint64(1); v <= 5; v++ {
		publishRotation(t, js, "hive-o", v)
	}
	rec := newRecorder()
	r := workertest.Start(t, js, spec("retryorder"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		v := versionOf(t, d)
		if rec.record(d.Key, v) == 1 && v == 2 {
			return errors.New("transient")
		}
		return nil
	}), fastRetries())
	workertest.WaitIdle(t, js, r.ConsumerName())
	want := "hive-o:1 hive-o:2 hive-o:2 hive-o:3 hive-o:4 hive-o:5"
	if got := strings.Join(rec.order, " "); got != want {
		t.Fatalf("order %q, want %q", got, want)
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

func TestShutdownFinishesInFlightAndReleasesQueued(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	// AckWait longer than any wait here: only a nak at shutdown can bring
	// the queued event back in time.
	const ackWait = 2 * workertest.DefaultTimeout
	started := make(chan struct{})
	finish := make(chan struct{})
	var finished atomic.Bool
	a := workertest.Start(t, js, spec("shutdown"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if versionOf(t, d) == 1 {
			close(started)
			<-finish
			finished.Store(true)
			return nil
		}
		return errors.New("the stopping worker must not start queued events")
	}), workers.WithAckWait(ackWait), workers.WithShutdownGrace(workertest.DefaultTimeout))
	publishRotation(t, js, "hive-sd", 1)
	publishRotation(t, js, "hive-sd", 2)
	<-started
	workertest.WaitUntil(t, "version 2 is delivered and queued", func() bool {
		return consumerInfo(t, js, a.ConsumerName()).NumAckPending == 2
	})
	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop() }()
	workertest.WaitUntil(t, "the worker stops being ready", func() bool { return a.Ready() != nil })
	close(finish)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if !finished.Load() {
		t.Fatal("the in-flight handler did not finish")
	}

	rec := newRecorder()
	b := workertest.Start(t, js, spec("shutdown"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}), workers.WithAckWait(ackWait))
	workertest.WaitIdle(t, js, b.ConsumerName())
	if rec.count(1) != 0 || rec.count(2) != 1 {
		t.Fatalf("after restart version 1 handled %d times, version 2 %d; want 0 and 1", rec.count(1), rec.count(2))
	}
}

func TestStateIsCompareAndSwap(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	r := workertest.Start(t, js, spec("state"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }))
	st := r.State()
	ctx := context.Background()
	var v struct{ Version string }
	rev, err := st.Get(ctx, "installed", &v)
	if err != nil || rev != 0 {
		t.Fatalf("missing document: rev %d, %v", rev, err)
	}
	rev1, err := st.Put(ctx, "installed", map[string]string{"Version": "1.0.0"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "installed", map[string]string{"Version": "0.9.0"}, 0); !errors.Is(err, workers.ErrConflict) {
		t.Fatalf("create over an existing document: %v", err)
	}
	if _, err := st.Put(ctx, "installed", map[string]string{"Version": "2.0.0"}, rev1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "installed", map[string]string{"Version": "1.5.0"}, rev1); !errors.Is(err, workers.ErrConflict) {
		t.Fatalf("write over a stale revision: %v", err)
	}
	if _, err := st.Get(ctx, "installed", &v); err != nil || v.Version != "2.0.0" {
		t.Fatalf("got %q, %v; want 2.0.0", v.Version, err)
	}
	if _, err := st.Put(ctx, "../escape", v, 0); err == nil {
		t.Fatal("a state name that is not a key was accepted")
	}
}

func TestLogsCarryTheFieldsAndMetricsAndHealthAreServed(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var logs bytes.Buffer
	var logMu sync.Mutex
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, spec("observe"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
		workers.WithLogger(zerolog.New(lockedWriter{&logMu, &logs})), workers.WithRegisterer(reg))
	ack := publishRotation(t, js, "hive-log", 7)
	workertest.WaitIdle(t, js, r.ConsumerName())

	logMu.Lock()
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"delivery handled"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if strings.Contains(logs.String(), "not-a-real-secret") {
		t.Error("event data reached the logs")
	}
	logMu.Unlock()
	for field, want := range map[string]any{"worker": testWorker, "instance": "observe", "key": "hive-log", "event_id": ack.ID,
		"type": events.TypeCredentialRotated, "seq": float64(ack.Sequence), "attempt": float64(1), "outcome": "applied"} {
		if line[field] != want {
			t.Errorf("log field %s = %v, want %v", field, line[field], want)
		}
	}
	if _, ok := line["duration"]; !ok {
		t.Error("no duration in the log line")
	}

	hs := httptest.NewServer(workers.NewServeMux(reg, r.Ready))
	defer hs.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d while running", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, `steward_events_total{instance="observe",result="applied",worker="rt"} 1`) {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	r.Stop()
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("/readyz %d after stop, want 503", code)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestRecordedStreamReplaysFromJSONL(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	r := workertest.Start(t, js, spec("jsonl"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}))
	acks := workertest.PublishFile(t, js, "testdata/rotations.jsonl")
	workertest.WaitIdle(t, js, r.ConsumerName())
	if len(acks) != 3 || !acks[2].Duplicate {
		t.Fatalf("acks %+v: want 3, the last a duplicate of the first", acks)
	}
	if got := strings.Join(rec.order, " "); got != "hive-j:1 hive-j:2" {
		t.Fatalf("handled %q", got)
	}

	// Replaying the stream through the handler again, outside the consumer.
	var results []workers.ReplayResult
	if err := r.Replay(context.Background(), workers.ReplayFrom{}, true, func(res workers.ReplayResult) { results = append(results, res) }); err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 || results[0].Err != nil || results[0].Key != "hive-j" {
		t.Fatalf("dry run: %+v", results)
	}
	if err := r.Replay(context.Background(), workers.ReplayFrom{Sequence: 2}, false, func(workers.ReplayResult) {}); err != nil {
		t.Fatal(err)
	}
	if rec.count(2) != 2 || rec.count(1) != 1 {
		t.Fatalf("replay from sequence 2 handled v1 %d and v2 %d times; want 1 and 2", rec.count(1), rec.count(2))
	}
}
