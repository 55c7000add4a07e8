package workers_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestOldAndNewProcessesOfOneInstanceLoseNothing runs a rolling upgrade:
// a process of the previous version (unsigned checkpoints, written after
// the upgrade record, which the new version does not believe) and a process
// of this one share one instance's consumer while events flow. Every event
// is handled by one of them, and the newest event of every key is handled:
// nothing is lost. What the old process applied the new one may decide
// again (handlers are idempotent); that is the price of not believing an
// unsigned document.
func TestOldAndNewProcessesOfOneInstanceLoseNothing(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	const keys, versions = 8, 12
	s := spec("rolling")

	var mu sync.Mutex
	handled := map[string]int{} // "<hive>:<version>" -> times
	note := func(hive string, v uint64) {
		mu.Lock()
		handled[hive+":"+strconv.FormatUint(v, 10)]++
		mu.Unlock()
	}
	// A short AckWait makes the new process look again at an event
	// waiting behind one the old process held every third of it (its
	// heartbeat), as a deployment's default does every ten seconds.
	r := workertest.Start(t, js, s, workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
		note(d.Key, versionOf(t, d))
		return nil
	}), workers.WithAckWait(time.Second), workers.WithLogger(zerolog.New(zerolog.NewTestWriter(t))))
	if _, err := workertest.OperatorDocs(t, js).RecordUpgrade(ctx); err != nil {
		t.Fatal(err)
	}

	// The previous version's process: the same durable consumer, a
	// checkpoint written as it wrote them (no proof), then the ack.
	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	old, err := js.Consumer(ctx, events.StreamEvents, r.ConsumerName())
	if err != nil {
		t.Fatal(err)
	}
	oldCtx, stopOld := context.WithCancel(ctx)
	defer stopOld()
	oldDone := make(chan struct{})
	go func() {
		defer close(oldDone)
		for oldCtx.Err() == nil {
			batch, err := old.Fetch(8, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				e, err := events.Decode(m.Headers(), m.Data())
				if err != nil {
					_ = m.Term()
					continue
				}
				var data events.CredentialRotated
				if err := e.DataAs(&data); err != nil {
					_ = m.Term()
					continue
				}
				meta, _ := m.Metadata()
				note(e.Subject(), data.Version)
				raw := fmt.Sprintf(`{"applied":%d,"eventId":%q}`, meta.Sequence.Stream, e.ID())
				_, _ = kv.Put(ctx, events.CheckpointKey(testWorker, "rolling", e.Type(), e.Subject()), []byte(raw))
				_ = m.DoubleAck(ctx)
			}
		}
	}()

	for v := uint64(1); v <= versions; v++ {
		for k := range keys {
			publishRotation(t, js, fmt.Sprintf("hive-%d", k), v)
		}
	}
	workertest.WaitIdle(t, js, r.ConsumerName())
	stopOld()
	<-oldDone

	mu.Lock()
	defer mu.Unlock()
	for k := range keys {
		for v := uint64(1); v <= versions; v++ {
			if handled[fmt.Sprintf("hive-%d:%d", k, v)] == 0 {
				t.Errorf("hive-%d version %d was handled by neither process: lost in the upgrade", k, v)
			}
		}
	}
	if t.Failed() {
		t.Logf("handled: %v", handled)
	}
}
