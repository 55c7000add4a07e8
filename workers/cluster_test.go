package workers_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestCompareAndSwapOnAThreeNodeCluster races two processes of one worker,
// connected to different nodes of a cluster with a replicated bucket, on
// one checkpoint (through SaveStage) and one state document. A lost race on
// a replicated bucket is error 10164, not 10071: both must read as
// ErrConflict, never as a failure to retry blindly.
func TestCompareAndSwapOnAThreeNodeCluster(t *testing.T) {
	c := workertest.StartCluster(t, 3)
	jsA, jsB := c.JetStream(t, 0, 3), c.JetStream(t, 1, 3)
	ctx := context.Background()
	h := workers.HandlerFunc(func(context.Context, *workers.Delivery) error { return nil })
	a, err := workers.New(jsA, spec("cas"), h, workers.WithReplicas(3), workertest.DocumentKeys(testWorker, "cas"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := workers.New(jsB, spec("cas"), h, workers.WithReplicas(3), workertest.DocumentKeys(testWorker, "cas"))
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []*workers.Runtime{a, b} {
		if err := w.Ensure(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The state document: both create it at once, then both update the
	// same revision.
	race := func(put func(w *workers.Runtime) error) (wins, conflicts int) {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, w := range []*workers.Runtime{a, b} {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = put(w) }()
		}
		wg.Wait()
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case errors.Is(err, events.ErrConflict):
				conflicts++
			default:
				t.Fatalf("a lost race came back as %v, not ErrConflict", err)
			}
		}
		return wins, conflicts
	}
	if w, c := race(func(w *workers.Runtime) error {
		_, err := w.State().Put(ctx, "installed", map[string]string{"by": w.ConsumerName()}, 0)
		return err
	}); w != 1 || c != 1 {
		t.Fatalf("create: %d wins and %d conflicts, want 1 and 1", w, c)
	}
	// A direct get may be answered by a replica that has not applied the
	// create yet (the bucket allows direct reads from every replica): a
	// stale read is safe, its revision only loses the race, so wait for
	// the replica to catch up rather than race with revision 0.
	var doc map[string]string
	var rev uint64
	workertest.WaitUntil(t, "the created state document is read back", func() bool {
		rev, err = a.State().Get(ctx, "installed", &doc)
		return err == nil && rev != 0
	})
	if w, c := race(func(w *workers.Runtime) error {
		_, err := w.State().Put(ctx, "installed", map[string]string{"v": "2"}, rev)
		return err
	}); w != 1 || c != 1 {
		t.Fatalf("update: %d wins and %d conflicts, want 1 and 1", w, c)
	}

	// The checkpoint: two deliveries of one event (as after a crash)
	// save a stage over the same revision.
	publishRotation(t, jsA, "hive-cas", 1)
	stale := make(chan *workers.Delivery, 1)
	errs := make(chan error, 1)
	ra := workertest.Start(t, jsA, spec("cas"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		copyOf := *d
		if err := d.SaveStage(ctx, "first"); err != nil {
			return err
		}
		// copyOf still holds the revision before that write: a second
		// process that read the checkpoint at the same time.
		stale <- &copyOf
		errs <- copyOf.SaveStage(ctx, "second")
		return nil
	}), workers.WithReplicas(3))
	workertest.WaitIdle(t, jsA, ra.ConsumerName())
	<-stale
	if err := <-errs; !errors.Is(err, events.ErrConflict) {
		t.Fatalf("a stage saved over a stale checkpoint revision came back as %v, want ErrConflict", err)
	}
}
