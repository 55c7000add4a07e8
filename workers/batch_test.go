package workers_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestARunOfOneKeySharesOneCheckpointWrite holds the first event of a key
// in its handler until nineteen more are queued behind it, then lets it go:
// the twenty are handled in order, the checkpoint is written once for the
// run (after every handler, before any ack), and every ack is confirmed.
func TestARunOfOneKeySharesOneCheckpointWrite(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	const n = 20

	g := newGate(t)
	var mu sync.Mutex
	var settled []workers.Settlement
	r := workertest.Start(t, js, spec("run"), g, workers.WithSettledHook(func(s workers.Settlement) {
		mu.Lock()
		settled = append(settled, s)
		mu.Unlock()
	}))

	var last uint64
	for v := uint64(1); v <= n; v++ {
		last = publishRotation(t, js, "hive-run", v).Sequence
	}
	workertest.WaitUntil(t, "all twenty held", func() bool { return consumerInfo(t, js, r.ConsumerName()).NumAckPending == n })

	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, events.CheckpointKey(testWorker, "run", events.TypeCredentialRotated, "hive-run"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()
	close(g.release)
	workertest.WaitIdle(t, js, r.ConsumerName())

	mu.Lock()
	defer mu.Unlock()
	if order := g.handled(); !slices.Equal(order, oneTo(n)) || len(settled) != n {
		t.Fatalf("handled %v and confirmed %d, want 1..%d in order, each confirmed", order, len(settled), n)
	}
	// Every write up to the one that records the last event: the
	// checkpoint is written before the acks WaitIdle saw confirmed.
	writes := 0
	for applied := uint64(0); applied < last; {
		select {
		case e := <-watch.Updates():
			var cp struct{ Applied uint64 }
			if err := json.Unmarshal(e.Value(), &cp); err != nil {
				t.Fatal(err)
			}
			writes++
			applied = cp.Applied
		case <-time.After(10 * time.Second):
			t.Fatalf("the checkpoint never reached sequence %d", last)
		}
	}
	// The first event is recorded on its own when its handler, held
	// here, ran longer than a run may wait (maxBatchAge); the nineteen
	// after it share one write.
	if writes > 2 {
		t.Fatalf("%d checkpoint writes for a run of %d events, want 1 or 2", writes, n)
	}
}

// TestARunWhoseCheckpointCannotBeWrittenIsRecordedLater makes the
// checkpoint bucket refuse every write (its stream's message size limit at
// one byte) while a run of five events is handled: nothing is acked while
// the run is not recorded, and once the bucket takes writes again the run
// is recorded and acked without any handler running a second time.
func TestARunWhoseCheckpointCannotBeWrittenIsRecordedLater(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	const n = 5

	g := newGate(t)
	var logs workertest.Logs
	r := workertest.Start(t, js, spec("unrecorded"), g, fastRetries(), workers.WithLogger(zerolog.New(&logs)))
	for v := uint64(1); v <= n; v++ {
		publishRotation(t, js, "hive-down", v)
	}
	workertest.WaitUntil(t, "all five held", func() bool { return consumerInfo(t, js, r.ConsumerName()).NumAckPending == n })

	bucket, err := js.Stream(ctx, "KV_"+events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	healthy := bucket.CachedInfo().Config
	broken := healthy
	broken.MaxMsgSize = 1
	if _, err := js.UpdateStream(ctx, broken); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	workertest.WaitUntil(t, "the run's checkpoint write fails", func() bool {
		return strings.Contains(logs.String(), "the checkpoint of a run of settled events could not be written")
	})
	if info := consumerInfo(t, js, r.ConsumerName()); info.NumAckPending != n {
		t.Fatalf("%d of %d events still held while their checkpoint is not written: one was acked first", info.NumAckPending, n)
	}
	if _, err := js.UpdateStream(ctx, healthy); err != nil {
		t.Fatal(err)
	}
	workertest.WaitIdle(t, js, r.ConsumerName())

	if got := g.handled(); !slices.Equal(got, oneTo(n)) {
		t.Fatalf("handled the versions %v, want each of 1..%d exactly once, in order", got, n)
	}
}

// oneTo is the versions 1..n.
func oneTo(n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(i + 1)
	}
	return out
}

// gate is a handler that holds version 1 until release is closed, so the
// events after it queue up in its lane, and notes the versions it handles.
type gate struct {
	t       *testing.T
	release chan struct{}
	mu      sync.Mutex
	order   []uint64
}

func newGate(t *testing.T) *gate { return &gate{t: t, release: make(chan struct{})} }

func (g *gate) Handle(_ context.Context, d *workers.Delivery) error {
	v := versionOf(g.t, d)
	if v == 1 {
		<-g.release
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.order = append(g.order, v)
	return nil
}

// handled returns the versions handled, in the order they were.
func (g *gate) handled() []uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]uint64(nil), g.order...)
}
