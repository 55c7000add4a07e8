package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestReadyOnlyOnceTheSourceReads: a worker whose streams, bucket and
// consumer exist but whose source has not started reading is not ready;
// a probe that said it was would count on a subscription that may yet
// fail. Run is held between Ensure and its source's first read.
func TestReadyOnlyOnceTheSourceReads(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w, err := workers.New(js, spec("ready"),
		workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil }),
		workers.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	entered, release := workers.GateRead(w)
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-entered:
	case <-time.After(workertest.DefaultTimeout):
		t.Fatal("Run did not get to its source's read")
	}
	if _, err := js.Consumer(ctx, events.StreamEvents, w.ConsumerName()); err != nil {
		t.Fatalf("Ensure was done, yet the consumer is not there: %v", err)
	}
	if err := w.Ready(); err == nil {
		t.Fatal("the worker says it is ready before its source reads")
	}
	release()
	workertest.WaitUntil(t, "the worker is ready once its source reads", func() bool { return w.Ready() == nil })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v when stopped", err)
		}
	case <-time.After(workertest.DefaultTimeout):
		t.Fatal("Run did not return once stopped")
	}
}
