package workers_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

func TestTheStreamReaderAppliesWithNoConsumer(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return d.Emit(ctx, "applied", nil)
	})
	for v := uint64(1); v <= 3; v++ {
		publishRotation(t, js, "hive-s", v)
	}
	r := workertest.Start(t, js, hostSpec("hive-s"), h, workers.WithReadMode(workers.ReadStream))
	workertest.WaitIdle(t, js, r.ConsumerName())
	publishRotation(t, js, "hive-s", 4)
	workertest.WaitIdle(t, js, r.ConsumerName())
	for v := uint64(1); v <= 4; v++ {
		if rec.count(v) != 1 {
			t.Fatalf("version %d handled %d times, want once", v, rec.count(v))
		}
	}
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := s.Info(context.Background()); info.State.Consumers != 0 {
		t.Fatalf("the stream has %d consumers; a stream reader needs none", info.State.Consumers)
	}

	// A restart reads from its cursor: nothing is handled twice, and what
	// was published while it was down is handled.
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	publishRotation(t, js, "hive-s", 5)
	r2 := workertest.Start(t, js, hostSpec("hive-s"), h, workers.WithReadMode(workers.ReadStream))
	workertest.WaitIdle(t, js, r2.ConsumerName())
	for v := uint64(1); v <= 5; v++ {
		if rec.count(v) != 1 {
			t.Fatalf("after a restart, version %d handled %d times, want once", v, rec.count(v))
		}
	}
}

func TestTheStreamReaderRetriesAndDeadLetters(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	reg := prometheus.NewRegistry()
	r := workertest.Start(t, js, hostSpec("hive-f"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		v := versionOf(t, d)
		n := rec.record(d.Key, v)
		switch {
		case v == 1 && n <= 2:
			return fmt.Errorf("dependency down (attempt %d)", n)
		case v == 2:
			return workers.Permanent(errors.New("no retry can read this"))
		}
		return d.Emit(ctx, "applied", nil)
	}), workers.WithReadMode(workers.ReadStream), fastRetries(), workers.WithRegisterer(reg))
	publishRotation(t, js, "hive-f", 1)
	publishRotation(t, js, "hive-f", 2)
	publishRotation(t, js, "hive-f", 3)
	workertest.WaitIdle(t, js, r.ConsumerName())
	if rec.count(1) != 3 || rec.count(2) != 1 || rec.count(3) != 1 {
		t.Fatalf("handled v1 %d, v2 %d, v3 %d times; want 3, 1, 1", rec.count(1), rec.count(2), rec.count(3))
	}
	if dls := workertest.DeadLetters(t, js, testWorker, "hive-f"); len(dls) != 1 {
		t.Fatalf("%d dead letters, want the permanent one", len(dls))
	}
	if got := counter(t, reg, "retried"); got != 2 {
		t.Fatalf("retried %v, want 2", got)
	}
}

// TestMovingFromAConsumerToTheStreamReader upgrades an instance that read
// through its durable consumer: the consumer's ack floor becomes the
// cursor, the consumer is deleted, and nothing is lost or handled twice.
func TestMovingFromAConsumerToTheStreamReader(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	})
	old := workertest.Start(t, js, hostSpec("hive-m"), h)
	publishRotation(t, js, "hive-m", 1)
	publishRotation(t, js, "hive-m", 2)
	workertest.WaitIdle(t, js, old.ConsumerName())
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}
	publishRotation(t, js, "hive-m", 3)

	r := workertest.Start(t, js, hostSpec("hive-m"), h, workers.WithReadMode(workers.ReadStream))
	workertest.WaitIdle(t, js, r.ConsumerName())
	for v := uint64(1); v <= 3; v++ {
		if rec.count(v) != 1 {
			t.Fatalf("version %d handled %d times across the move, want once", v, rec.count(v))
		}
	}
	if _, err := js.Consumer(context.Background(), events.StreamEvents, r.ConsumerName()); err == nil {
		t.Fatal("the old consumer still exists after the move")
	}
}

// TestTheStreamReaderIsLatestWins: a burst for one host under a
// latest-wins Spec applies the newest once, as with a consumer.
func TestTheStreamReaderIsLatestWins(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for v := uint64(1); v <= 200; v++ {
		publishRotation(t, js, "hive-l", v)
	}
	rec := newRecorder()
	s := latestSpec("hive-l")
	s.Subjects = hostSpec("hive-l").Subjects
	r := workertest.Start(t, js, s, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return d.Emit(ctx, "applied", nil)
	}), workers.WithReadMode(workers.ReadStream))
	workertest.WaitIdle(t, js, r.ConsumerName())
	for v := uint64(1); v < 200; v++ {
		if rec.count(v) != 0 {
			t.Fatalf("version %d was applied; only the newest should be", v)
		}
	}
	if rec.count(200) != 1 {
		t.Fatalf("version 200 applied %d times, want once", rec.count(200))
	}
}

// TestAStreamReaderPausesAndResumes: a paused stream reader reads nothing
// (there is no consumer to pause), and reads at once when resumed.
func TestAStreamReaderPausesAndResumes(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	r := workertest.Start(t, js, hostSpec("hive-p"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}), workers.WithReadMode(workers.ReadStream))
	publishRotation(t, js, "hive-p", 1)
	workertest.WaitIdle(t, js, r.ConsumerName())

	ctx := context.Background()
	docs := workertest.OperatorDocs(t, js)
	if p, err := ops.Pause(ctx, js, docs, testWorker, "hive-p", time.Now().Add(time.Hour)); err != nil || !p.Paused {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	// The control message and the pause document travel on one
	// connection, in order, ahead of the event: a window in which the
	// event must not be handled is the observation, not a wait.
	publishRotation(t, js, "hive-p", 2)
	window := time.Now().Add(time.Second)
	for time.Now().Before(window) {
		if rec.count(2) != 0 {
			t.Fatal("a paused stream reader handled an event")
		}
		runtime.Gosched()
	}
	if _, err := ops.Resume(ctx, js, docs, testWorker, "hive-p"); err != nil {
		t.Fatal(err)
	}
	workertest.WaitIdle(t, js, r.ConsumerName())
	if rec.count(2) != 1 {
		t.Fatalf("after resuming, version 2 was handled %d times, want once", rec.count(2))
	}
}

// TestTheStreamReaderWritesItsCursorOnceQuiet publishes ten events one
// after the other, each handled before the next: the reader goes idle ten
// times, and wrote its cursor at each before it waited for a quiet moment
// (4,000 writes for a site's 10,000 events). It writes once it has been
// quiet, and the cursor then covers the last event.
func TestTheStreamReaderWritesItsCursorOnceQuiet(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	rec := newRecorder()
	spec := hostSpec("hive-q")
	publishRotation(t, js, "hive-q", 1)
	r := workertest.Start(t, js, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	}), workers.WithReadMode(workers.ReadStream))
	workertest.WaitIdle(t, js, r.ConsumerName())
	docs := workertest.OperatorDocs(t, js)
	key := events.CursorKey(testWorker, "hive-q")
	cursorAt := func() uint64 {
		var c events.Cursor
		doc, err := docs.Get(ctx, key)
		if err != nil || !doc.Trusted || doc.Decode(&c) != nil {
			return 0
		}
		return c.Subjects[spec.Subjects[0]]
	}
	workertest.WaitUntil(t, "the first cursor is written", func() bool { return cursorAt() > 0 })

	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, key, jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	var last uint64
	for v := uint64(2); v <= 11; v++ {
		last = publishRotation(t, js, "hive-q", v).Sequence
		workertest.WaitUntil(t, fmt.Sprintf("version %d is handled", v), func() bool { return rec.count(v) == 1 })
	}
	workertest.WaitUntil(t, "the cursor covers the last event", func() bool { return cursorAt() == last })
	writes := 0
	for {
		select {
		case e := <-watch.Updates():
			if e != nil {
				writes++
				continue
			}
		default:
		}
		break
	}
	if writes > 2 {
		t.Fatalf("the cursor was written %d times for 10 events handled one after the other; want it written once quiet", writes)
	}
}

// A stream whose stored notices do not cover an instance's subjects would
// never wake it between resyncs (its permissions allow it nothing else to
// listen to): stream mode refuses to start, saying which subject, what the
// stream sends notices of, and the two ways out. Once the operator's
// set-up covers it again, the same instance starts and applies.
func TestTheStreamReaderRefusesAStreamThatSendsNoNoticesOfItsSubjects(t *testing.T) {
	js := workertest.StartServer(t).JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	setup := func(notices string) {
		t.Helper()
		cfg := events.DefaultBusConfig(1)
		cfg.Streams.Notices = notices
		if err := events.SetupBus(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
	}
	rec := newRecorder()
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		return nil
	})
	for notices, covered := range map[string]string{
		"":                                    "sends stored notices of no event",
		events.EventsPrefix + ".invitation.>": "sends stored notices of only steward.events.invitation.>",
		events.EventsPrefix + ".credential.rotated.hive-m": "sends stored notices of only steward.events.credential.rotated.hive-m",
	} {
		setup(notices)
		w, err := workers.New(js, hostSpec("hive-n"), h, workers.WithReadMode(workers.ReadStream), workers.WithRegisterer(prometheus.NewRegistry()))
		if err != nil {
			t.Fatal(err)
		}
		err = w.Run(ctx)
		for _, want := range []string{"steward.events.credential.rotated.hive-n", covered, "--stored-notices steward.events.>", "--read-mode consumer"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("with stored notices %q, Run returned %v; want a refusal saying %q", notices, err, want)
			}
		}
	}

	setup(events.DefaultNotices)
	publishRotation(t, js, "hive-n", 1)
	r := workertest.Start(t, js, hostSpec("hive-n"), h, workers.WithReadMode(workers.ReadStream))
	workertest.WaitIdle(t, js, r.ConsumerName())
	if rec.count(1) != 1 {
		t.Fatalf("with every event's notices, version 1 was handled %d times, want once", rec.count(1))
	}
}
