package workers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

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
	if _, err := st.Put(ctx, "installed", map[string]string{"Version": "0.9.0"}, 0); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("create over an existing document: %v", err)
	}
	if _, err := st.Put(ctx, "installed", map[string]string{"Version": "2.0.0"}, rev1); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "installed", map[string]string{"Version": "1.5.0"}, rev1); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("write over a stale revision: %v", err)
	}
	if _, err := st.Get(ctx, "installed", &v); err != nil || v.Version != "2.0.0" {
		t.Fatalf("got %q, %v; want 2.0.0", v.Version, err)
	}
	if _, err := st.Put(ctx, "../escape", v, 0); err == nil {
		t.Fatal("a state name that is not a key was accepted")
	}
}

// TestStartsOnAStoreThePreviousVersionWrote lays out the bucket and the
// consumer exactly as the previous runtime created them (MaxDeliver 10, an
// unsigned checkpoint with a saved stage), records the upgrade as `steward
// setup` does, then starts this runtime on them: the applied event is
// skipped, the staged one resumes from its stage, and the legacy document
// is signed again. An unsigned checkpoint written after the upgrade record
// is not believed: its key's event is handled, not skipped.
func TestStartsOnAStoreThePreviousVersionWrote(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	first := publishRotation(t, js, "hive-u", 1)
	second := publishRotation(t, js, "hive-u", 2)

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: events.CheckpointBucket, Description: "Steward workers' checkpoints and state",
		Storage: jetstream.FileStorage, Replicas: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf(`{"applied":%d,"eventId":"old-1","stageSeq":%d,"stage":{"stage":"running","execution":"exec-7"}}`, first.Sequence, second.Sequence)
	key := "cp." + testWorker + ".upgrade.credential-rotated.hive-u"
	if _, err := kv.Put(ctx, key, []byte(old)); err != nil {
		t.Fatal(err)
	}
	if _, err := workertest.OperatorDocs(t, js).RecordUpgrade(ctx); err != nil {
		t.Fatal(err)
	}
	// Written after the record, unsigned: what reflection leaves.
	late := publishRotation(t, js, "hive-v", 1)
	forged := fmt.Sprintf(`{"applied":%d}`, late.Sequence+1000)
	if _, err := kv.Put(ctx, "cp."+testWorker+".upgrade.credential-rotated.hive-v", []byte(forged)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{
		Durable: testWorker + "-upgrade", FilterSubjects: spec("upgrade").Subjects,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: 10, MaxAckPending: 512,
	}); err != nil {
		t.Fatal(err)
	}

	rec := newRecorder()
	var resumed map[string]string
	r := workertest.Start(t, js, spec("upgrade"), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		rec.record(d.Key, versionOf(t, d))
		if _, err := d.LoadStage(&resumed); err != nil {
			return err
		}
		return nil
	}))
	workertest.WaitIdle(t, js, r.ConsumerName())

	if rec.count(1) != 1 || rec.count(2) != 1 {
		// hive-u's v1 is skipped (the legacy checkpoint says so);
		// hive-v's v1 is handled (its unsigned checkpoint is not believed).
		t.Fatalf("handled v1 %d and v2 %d times, want 1 (hive-v only) and 1", rec.count(1), rec.count(2))
	}
	rec.mu.Lock()
	order := slices.Clone(rec.order)
	rec.mu.Unlock()
	if slices.Contains(order, "hive-u:1") || !slices.Contains(order, "hive-v:1") {
		t.Fatalf("handled %v, want hive-u's v1 skipped and hive-v's handled", order)
	}
	entry, err := kv.Get(ctx, key)
	if err != nil || !strings.Contains(string(entry.Value()), `"proof":`) {
		t.Fatalf("the legacy checkpoint was not signed again after it was read: %s (%v)", entry.Value(), err)
	}
	if resumed["execution"] != "exec-7" {
		t.Fatalf("resumed from %v, want the stage the previous version saved", resumed)
	}
	if info := consumerInfo(t, js, r.ConsumerName()); info.Config.MaxDeliver != -1 {
		t.Fatalf("the consumer kept MaxDeliver %d; desired state must never run out of deliveries", info.Config.MaxDeliver)
	}
}
