package workers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

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
