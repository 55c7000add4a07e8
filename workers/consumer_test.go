package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

func hostSpec(hive string) workers.Spec {
	return workers.Spec{
		Name: testWorker, Instance: hive,
		Subjects: []string{"steward.events.credential.rotated." + hive},
		Types:    []string{events.TypeCredentialRotated},
	}
}

func newWorker(t *testing.T, js jetstream.JetStream, s workers.Spec, opts ...workers.Option) *workers.Runtime {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opts = append([]workers.Option{workers.WithRegisterer(prometheus.NewRegistry())}, opts...)
	w, err := workers.New(js, s, workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }), opts...)
	if err != nil {
		t.Fatal(err)
	}
	// New creates nothing; Ensure makes the consumer as Run would.
	if err := w.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// newWorkerConsumer is newWorker and the consumer Ensure made for it, for
// a test that reads it through the runtime's source (ReadWithPulls).
func newWorkerConsumer(t *testing.T, js jetstream.JetStream, s workers.Spec) (*workers.Runtime, jetstream.Consumer) {
	t.Helper()
	w := newWorker(t, js, s)
	c, err := js.Consumer(context.Background(), events.StreamEvents, w.ConsumerName())
	if err != nil {
		t.Fatal(err)
	}
	return w, c
}

func fleetConsumerInfo(t *testing.T, js jetstream.JetStream, name string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, events.StreamEvents, name)
	if err != nil {
		t.Fatal(err)
	}
	return c.CachedInfo()
}

// A host-bound consumer is R1; starting again with the same config writes
// nothing (the consumer's creation time and config stay); a start with
// another config updates it in place, under its name, keeping what it
// delivered and had acked.
func TestEnsureConsumerIsR1ForHostsAndUpdatesInPlace(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	s := hostSpec("hive-1")
	w := newWorker(t, js, s)
	info := fleetConsumerInfo(t, js, w.ConsumerName())
	if info.Config.Replicas != 1 {
		t.Fatalf("host-bound consumer has %d replicas, want 1", info.Config.Replicas)
	}
	if info.Config.MaxDeliver != -1 || info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		t.Fatalf("consumer config %+v lost the runtime's settings", info.Config)
	}

	// Deliver and ack one event, then change the config as an upgrade does.
	run := workertest.Start(t, js, s, workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
		workers.WithRegisterer(prometheus.NewRegistry()))
	publishRotation(t, js, "hive-1", 1)
	workertest.WaitIdle(t, js, w.ConsumerName())
	if err := run.Stop(); err != nil {
		t.Fatal(err)
	}
	before := fleetConsumerInfo(t, js, w.ConsumerName())
	newWorker(t, js, s, workers.WithAckWait(7*time.Second))
	after := fleetConsumerInfo(t, js, w.ConsumerName())
	if after.Config.AckWait != 7*time.Second {
		t.Fatalf("ack wait %v after the update, want 7s", after.Config.AckWait)
	}
	if after.AckFloor.Consumer != before.AckFloor.Consumer || after.Delivered.Consumer != before.Delivered.Consumer || after.Created != before.Created {
		t.Fatalf("the update replaced the consumer: before %+v/%+v created %v, after %+v/%+v created %v",
			before.Delivered, before.AckFloor, before.Created, after.Delivered, after.AckFloor, after.Created)
	}
}

// A stream that reached its consumer limit refuses the next instance
// with an error that names the limit, the count and the setting.
func TestConsumerLimitIsNamed(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := events.DefaultBusConfig(1)
	cfg.Streams.MaxConsumers = 2
	if err := events.SetupBus(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	newWorker(t, js, hostSpec("hive-1"))
	newWorker(t, js, hostSpec("hive-2"))
	third, err := workers.New(js, hostSpec("hive-3"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
		workers.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	err = third.Ensure(ctx)
	var le *events.LimitError
	if !errors.As(err, &le) {
		t.Fatalf("third instance: %v, want a LimitError", err)
	}
	for _, want := range []string{"max_consumers of 2", "(now 2)", "--max-consumers", "STEWARD_MAX_CONSUMERS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// A worker starting leaves the limits an operator set alone.
func TestWorkerStartKeepsOperatorLimits(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := events.DefaultBusConfig(1)
	cfg.Streams.MaxBytes = 123 << 20
	cfg.CheckpointMaxBytes = 77 << 20
	if err := events.SetupBus(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	newWorker(t, js, hostSpec("hive-1"))
	s, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxBytes; got != 123<<20 {
		t.Errorf("events max bytes %d after a worker started, want the operator's %d", got, 123<<20)
	}
	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.MaxBytes; got != 77<<20 {
		t.Errorf("checkpoint max bytes %d after a worker started, want the operator's %d", got, 77<<20)
	}
}

// New only checks: a runtime that is built and never run leaves nothing on
// the server (a dry run, a test that builds one to read its Spec).
func TestNewCreatesNothingOnTheServer(t *testing.T) {
	srv := workertest.StartServer(t)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := workers.New(js, hostSpec("hive-n"), workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
		workers.WithRegisterer(prometheus.NewRegistry())); err != nil {
		t.Fatal(err)
	}
	names := js.StreamNames(ctx)
	var found []string
	for n := range names.Name() {
		found = append(found, n)
	}
	if len(found) != 0 {
		t.Fatalf("New created %v on the server; it must create nothing until the worker runs", found)
	}
}

// TestRunEndsWithAReason ends a running worker's consumer from outside, by
// closing its connection for good or deleting the consumer: Run returns on
// its own, saying why, rather than waiting on a consumer it can no longer
// read (a supervisor restarts it, and the restart makes the consumer
// again).
func TestRunEndsWithAReason(t *testing.T) {
	for _, c := range []struct {
		name, want string
		end        func(t *testing.T, nc *nats.Conn, js jetstream.JetStream, consumer string)
	}{
		{"its connection closes", "connection closed", func(_ *testing.T, nc *nats.Conn, _ jetstream.JetStream, _ string) { nc.Close() }},
		{"its consumer is deleted", jetstream.ErrConsumerDeleted.Error(), func(t *testing.T, _ *nats.Conn, js jetstream.JetStream, consumer string) {
			ctx, cancel := context.WithTimeout(context.Background(), workertest.DefaultTimeout)
			defer cancel()
			// nats.go sends the first pull from a goroutine of its own, so
			// Ready can come before the server holds it. Deleted then, the
			// consumer answers nothing and its end is noticed only when
			// heartbeats are missed (TestAConsumerGoneBeforeItsPullIsNoticed);
			// this case is the deletion a waiting pull hears of at once.
			workertest.WaitUntil(t, "the worker's pull waits on its consumer", func() bool {
				c, err := js.Consumer(ctx, events.StreamEvents, consumer)
				return err == nil && c.CachedInfo().NumWaiting > 0
			})
			if err := js.DeleteConsumer(ctx, events.StreamEvents, consumer); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := workertest.StartServer(t)
			nc := srv.Connect(t)
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			w, err := workers.New(js, spec("ending"),
				workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
				workers.WithRegisterer(prometheus.NewRegistry()))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- w.Run(context.Background()) }()
			workertest.WaitUntil(t, "the worker is ready", func() bool { return w.Ready() == nil })
			c.end(t, nc, js, w.ConsumerName())
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "starting the worker again") {
					t.Fatalf("Run returned %v, want it to say %q and what to do next", err, c.want)
				}
			case <-time.After(workertest.DefaultTimeout):
				t.Fatalf("Run did not return after %s", c.name)
			}
		})
	}
}

// TestAConsumerGoneBeforeItsPullIsNoticed deletes a worker's consumer
// before its first pull reaches the server: that pull, and every one
// after, is answered by nothing (no 409, which only a waiting pull hears),
// so the worker would pull into the void for good. Once the heartbeats it
// asked for are missed it asks for the consumer, and ends, saying why.
func TestAConsumerGoneBeforeItsPullIsNoticed(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.DefaultTimeout)
	defer cancel()
	w, consumer := newWorkerConsumer(t, js, spec("gone"))
	if err := js.DeleteConsumer(ctx, events.StreamEvents, w.ConsumerName()); err != nil {
		t.Fatal(err)
	}
	done, stopped, err := workers.ReadWithPulls(w, consumer, jetstream.PullExpiry(2*time.Second), jetstream.PullHeartbeat(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the worker still pulls from a consumer the server no longer has")
	}
	if err := stopped(); !errors.Is(err, jetstream.ErrConsumerDeleted) || !strings.Contains(err.Error(), "went unanswered") ||
		!strings.Contains(err.Error(), "starting the worker again") {
		t.Fatalf("the worker stopped with %v, want the consumer deleted, how that was found and what to do next", err)
	}
}

// TestAConnectionClosedUnnoticedByItsIteratorIsNoticed closes a worker's
// connection under an iterator that does not close with it, as nats.go's
// does not when the close lands while it sets up the subscription (27 of
// 3,000 starts closed at once, under load): the worker would wait on it for
// good. Once the heartbeats it asked for are missed it finds the
// connection closed, and ends, saying why.
func TestAConnectionClosedUnnoticedByItsIteratorIsNoticed(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), workertest.DefaultTimeout)
	defer cancel()
	w, consumer := newWorkerConsumer(t, js, spec("unnoticed"))
	done, stopped, err := workers.ReadMissingItsClose(w, consumer, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	js.Conn().Close()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the worker still waits on a connection that has closed")
	}
	if err := stopped(); !errors.Is(err, nats.ErrConnectionClosed) || !strings.Contains(err.Error(), "starting the worker again") {
		t.Fatalf("the worker stopped with %v, want the connection closed and what to do next", err)
	}
}

// TestPullsOnTheWireCarryTheFleetsExpiryOnlyForHosts reads the pull
// requests themselves, as the server gets them: a host-bound instance asks
// with the fleet's five-minute expiry and thirty-second heartbeat, a
// shared one with nats.go's defaults, and both for as many events as the
// consumer may have outstanding.
func TestPullsOnTheWireCarryTheFleetsExpiryOnlyForHosts(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for _, c := range []struct {
		spec    workers.Spec
		expires time.Duration
	}{
		{hostSpec("hive-wire"), 5 * time.Minute},
		{spec("wire"), 30 * time.Second},
	} {
		name := c.spec.Name + "-" + c.spec.Instance
		pulls, err := js.Conn().SubscribeSync("$JS.API.CONSUMER.MSG.NEXT." + events.StreamEvents + "." + name)
		if err != nil {
			t.Fatal(err)
		}
		workertest.Start(t, js, c.spec, workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
			workers.WithConcurrency(4))
		m, err := pulls.NextMsg(workertest.DefaultTimeout)
		if err != nil {
			t.Fatalf("%s sent no pull request: %v", name, err)
		}
		var req struct {
			Batch     int           `json:"batch"`
			Expires   time.Duration `json:"expires"`
			Heartbeat time.Duration `json:"idle_heartbeat"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Fatal(err)
		}
		if req.Expires != c.expires || req.Batch != 4*64 {
			t.Fatalf("%s pulls %+v, want a batch of %d expiring after %v", name, req, 4*64, c.expires)
		}
		if c.expires == 5*time.Minute && req.Heartbeat != 30*time.Second {
			t.Fatalf("%s pulls with a %v heartbeat, want 30s", name, req.Heartbeat)
		}
	}
}
