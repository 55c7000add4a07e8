package workers_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

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
