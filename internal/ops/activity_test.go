package ops_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestActivityCountsEachMinuteByTime publishes three events and has a
// worker settle two of them (one applied, one dead-lettered), then charts
// a window that ends two minutes later than now: the by-time lookups must
// put every message in the minute the server stored it, and nothing in the
// minutes after, and the backlog is worked back from now's.
func TestActivityCountsEachMinuteByTime(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	stored := time.Now()
	publishTraced(t, js, "h1", 1, "")
	publishTraced(t, js, "h1", 2, "")
	publishTraced(t, js, "h9", 1, "") // no worker reads it: the backlog
	w := workertest.Start(t, js, credSpec("h1"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		if r.Version == 2 {
			return workers.Permanent(errors.New("the hive's folder is gone"))
		}
		return d.Emit(ctx, "applied", map[string]any{"version": r.Version})
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the dead letter is stored", func() bool { return len(workertest.DeadLetters(t, js, "credential", "h1")) == 1 })
	settled := time.Now()

	idx := ops.NewTimeIndex()
	for round := range 2 { // the second round answers from the index
		a, err := ops.GetActivity(ctx, js, ops.ActivityOptions{Now: settled.Add(2 * time.Minute), Minutes: 10, Backlog: 1, Index: idx})
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Minutes) != 10 {
			t.Fatalf("%d minutes, want 10", len(a.Minutes))
		}
		var in, out uint64
		for _, m := range a.Minutes {
			inStore := !m.Start.After(settled) && m.Start.Add(time.Minute).After(stored.Add(-time.Minute))
			if !inStore && (m.Stored != 0 || m.Settled != 0) {
				t.Fatalf("round %d: minute %s counts %d stored and %d settled; everything was stored between %s and %s", round, m.Start, m.Stored, m.Settled, stored, settled)
			}
			in, out = in+m.Stored, out+m.Settled
		}
		if in != 3 || out != 2 {
			t.Fatalf("round %d: %d stored and %d settled over the window; want 3 and 2: %+v", round, in, out, a.Minutes)
		}
		last := a.Minutes[len(a.Minutes)-1]
		if last.Backlog != 1 || a.Minutes[0].Backlog != 0 || a.MaxRate < 2 {
			t.Fatalf("round %d: backlog %d at the end and %d at the start (want 1 and 0), max rate %d", round, last.Backlog, a.Minutes[0].Backlog, a.MaxRate)
		}
	}
}
