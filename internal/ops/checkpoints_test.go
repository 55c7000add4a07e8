package ops_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestCheckpointsOfAKeyAsTheRuntimeWroteThem runs a real worker whose
// handler saves a stage holding a password and then fails, and reads the
// key's checkpoint through ops: the stage is there with the password
// elided; once the handler succeeds, the checkpoint names the applied
// sequence and event. It holds ops to the key the runtime writes (events.CheckpointKey).
func TestCheckpointsOfAKeyAsTheRuntimeWroteThem(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	var fixed atomic.Bool
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if err := d.SaveStage(ctx, map[string]string{"step": "written", "password": "hunter2"}); err != nil {
			return err
		}
		if !fixed.Load() {
			return errors.New("the hive is not reachable yet")
		}
		return nil
	})
	w := workertest.Start(t, js, credSpec("hive-1"), h, workers.WithLogger(zerolog.Nop()))
	ack := workertest.PublishData(t, js, events.TypeCredentialRotated, "hive-1", rotation("hive-1", 1))
	ctx := context.Background()
	var cps []ops.Checkpoint
	workertest.WaitUntil(t, "the stage is saved", func() bool {
		var err error
		cps, err = ops.GetCheckpoints(ctx, js, nil, "credential", "hive-1", "")
		if err != nil {
			t.Fatal(err)
		}
		return len(cps) == 1 && cps[0].StageSeq == ack.Sequence
	})
	cp := cps[0]
	if cp.Instance != "hive-1" || cp.Type != events.TypeCredentialRotated || cp.BucketKey != "cp.credential.hive-1.credential-rotated.hive-1" ||
		cp.Applied != 0 || !strings.Contains(cp.Stage, `"step": "written"`) || strings.Contains(cp.Stage, "hunter2") {
		t.Fatalf("checkpoint while retrying: %+v", cp)
	}
	fixed.Store(true)
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the checkpoint names the applied event", func() bool {
		cps, _ = ops.GetCheckpoints(ctx, js, nil, "credential", "hive-1", "hive-1")
		return len(cps) == 1 && cps[0].Applied == ack.Sequence
	})
	if cps[0].EventID != ack.ID {
		t.Fatalf("checkpoint after applying: %+v, want event %s", cps[0], ack.ID)
	}
	if other, err := ops.GetCheckpoints(ctx, js, nil, "credential", "hive-1", "hive-2"); err != nil || len(other) != 0 {
		t.Fatalf("another instance's checkpoints: %+v, %v", other, err)
	}
	if k := events.CheckpointKey("converge", "prod", events.TypeReleasePublished, "1.2.3+build"); !strings.HasPrefix(k, "cp.converge.prod.release-published._") || strings.ContainsAny(k, "+") {
		t.Fatalf("the checkpoint key of a version: %s", k)
	}
}
