package workers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

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

// dependency is a fake downstream service a test takes down and brings up.
type dependency struct {
	mu       sync.Mutex
	down     bool
	attempts int
}

func (d *dependency) call() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attempts++
	if d.down {
		return fmt.Errorf("connect to the database: connection refused (attempt %d)", d.attempts)
	}
	return nil
}

func (d *dependency) set(down bool) {
	d.mu.Lock()
	d.down = down
	d.mu.Unlock()
}

func (d *dependency) calls() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.attempts
}

// cappedBackoff is the runtime's exponential backoff with a short cap.
func cappedBackoff(limit time.Duration) workers.Option { return workers.WithMaxBackoff(limit) }

func TestARetryableFailureOutlastingTheOldBudgetAppliesWhenItRecovers(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	dep := &dependency{down: true}
	const maxDeliver, limit = 3, 100 * time.Millisecond
	r := workertest.Start(t, js, spec("outage"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if err := dep.call(); err != nil {
			return err
		}
		return d.Emit(ctx, "applied", nil)
	}), cappedBackoff(limit), workers.WithMaxDeliver(maxDeliver))
	publishRotation(t, js, "hive-o", 1)

	// Down for longer than MaxDeliver × the cap, and for many more
	// attempts than MaxDeliver: the old runtime dead-lettered it here.
	start := time.Now()
	workertest.WaitUntil(t, "the handler has failed 12 times over more than MaxDeliver × the backoff cap", func() bool {
		return dep.calls() >= 12 && time.Since(start) > 2*maxDeliver*limit
	})
	if dls := workertest.DeadLetters(t, js, testWorker, "outage"); len(dls) != 0 {
		t.Fatalf("dead-lettered during the outage: %s", dls[0].Reason)
	}
	dep.set(false)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if got := outcomeTypes(t, js, "outage"); got["applied"] != 1 {
		t.Fatalf("outcomes %v, want it applied once the dependency was back", got)
	}
	if dls := workertest.DeadLetters(t, js, testWorker, "outage"); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none", len(dls))
	}
	if info := consumerInfo(t, js, r.ConsumerName()); info.NumRedelivered != 0 {
		t.Fatalf("%d redeliveries: retries must not spend deliveries", info.NumRedelivered)
	}
}

func TestANewerEventEndsAnOlderOnesRetries(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	dep := &dependency{down: true}
	var mu sync.Mutex
	var applied []uint64
	r := workertest.Start(t, js, latestSpec("newer"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		v := versionOf(t, d)
		if v == 1 {
			if err := dep.call(); err != nil {
				return err
			}
		}
		mu.Lock()
		applied = append(applied, v)
		mu.Unlock()
		return d.Emit(ctx, "applied", nil)
	}), cappedBackoff(time.Minute))
	publishRotation(t, js, "hive-n", 1)
	workertest.WaitUntil(t, "version 1 is being retried", func() bool { return dep.calls() >= 2 })
	publishRotation(t, js, "hive-n", 2)
	workertest.WaitIdle(t, js, r.ConsumerName())

	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 1 || applied[0] != 2 {
		t.Fatalf("applied %v, want only version 2", applied)
	}
	if got := outcomeTypes(t, js, "newer"); got["superseded"] != 1 || got["applied"] != 1 {
		t.Fatalf("outcomes %v, want version 1 superseded and version 2 applied", got)
	}
}

func TestPanicsAreBoundedThenDeadLettered(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	rec := newRecorder()
	r := workertest.Start(t, js, spec("panics"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		panic("index out of range in the handler")
	}), fastRetries(), workers.WithMaxPanics(3))
	publishRotation(t, js, "hive-p", 1)
	publishRotation(t, js, "hive-p", 2)
	workertest.WaitIdle(t, js, r.ConsumerName())

	if rec.count(1) != 3 || rec.count(2) != 3 {
		t.Fatalf("handled v1 %d and v2 %d times, want 3 each", rec.count(1), rec.count(2))
	}
	dls := workertest.DeadLetters(t, js, testWorker, "panics")
	if len(dls) != 2 || !strings.Contains(dls[0].Reason, "panicked 3 times") || !strings.Contains(dls[0].Reason, "index out of range") {
		t.Fatalf("dead letters %+v", dls)
	}
}

func TestRetryingKeysAreInTheStatusDocumentWithSecretsElided(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	dep := &dependency{down: true}
	const secret = "-----BEGIN AGE ENCRYPTED FILE-----\nc2VjcmV0\n-----END AGE ENCRYPTED FILE-----"
	r := workertest.Start(t, js, spec("status"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if err := dep.call(); err != nil {
			return fmt.Errorf("could not use %s: %w", secret, err)
		}
		return nil
	}), cappedBackoff(50*time.Millisecond), workers.WithAckWait(300*time.Millisecond), workertest.StatusEvery(10*time.Millisecond))
	publishRotation(t, js, "hive-s", 1)

	docs := workertest.OperatorDocs(t, js)
	var st events.Status
	workertest.WaitUntil(t, "the status document shows hive-s retrying", func() bool {
		s, ok, err := readStatus(docs, testWorker, "status")
		st = s
		return err == nil && ok && len(s.Retrying) == 1 && s.Retrying[0].Attempt >= 2
	})
	k := st.Retrying[0]
	if k.Key != "hive-s" || k.FirstFailure.IsZero() || !strings.Contains(k.LastError, "connection refused") {
		t.Fatalf("retrying %+v", k)
	}
	if strings.Contains(k.LastError, "c2VjcmV0") {
		t.Fatalf("the status document holds the secret: %q", k.LastError)
	}
	dep.set(false)
	workertest.WaitIdle(t, js, r.ConsumerName())
	workertest.WaitUntil(t, "the status document shows nothing retrying", func() bool {
		s, ok, err := readStatus(docs, testWorker, "status")
		return err == nil && ok && len(s.Retrying) == 0
	})
}

// TestTheStatusDocumentSaysAtOnceWhenAKeyStartsAndStopsRetrying holds the
// interval at an hour, so only the runtime's prompt write can show a key
// retrying and then show it settled.
func TestTheStatusDocumentSaysAtOnceWhenAKeyStartsAndStopsRetrying(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	dep := &dependency{down: true}
	r := workertest.Start(t, js, spec("prompt"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return dep.call()
	}), cappedBackoff(50*time.Millisecond), workertest.StatusEvery(time.Hour))
	docs := workertest.OperatorDocs(t, js)
	publishRotation(t, js, "hive-p", 1)
	workertest.WaitUntil(t, "the status document shows hive-p retrying", func() bool {
		s, ok, err := readStatus(docs, testWorker, "prompt")
		return err == nil && ok && len(s.Retrying) == 1 && s.Retrying[0].Key == "hive-p"
	})
	dep.set(false)
	workertest.WaitIdle(t, js, r.ConsumerName())
	workertest.WaitUntil(t, "the status document shows hive-p settled", func() bool {
		s, ok, err := readStatus(docs, testWorker, "prompt")
		return err == nil && ok && len(s.Retrying) == 0
	})
}

// readStatus reads the status document of a worker instance as it is
// stored, unredacted: a missing one (nothing ever retried) is false, and
// one that does not verify as the instance's is an error.
func readStatus(docs *events.Store, worker, instance string) (events.Status, bool, error) {
	var st events.Status
	d, err := docs.Get(context.Background(), events.StatusKey(worker, instance))
	if err != nil || !d.Present() {
		return st, false, err
	}
	if !d.Trusted {
		return st, false, fmt.Errorf("the status of %s-%s does not verify as the instance's", worker, instance)
	}
	return st, true, d.Decode(&st)
}
