package workers

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/internal/enginetest"
	"github.com/steward-dev/steward/workers/internal/memory"
)

// memoryEngine is a Runtime over memory, fed one burst at a time by its
// caller (enginetest.Engine).
type memoryEngine struct{ w *Runtime }

// newMemoryEngine builds the Runtime as New does, with what suits a test
// as defaults (metrics of its own, retries in rounds), then puts memory
// where the server would be: the streams seam, the bucket, and a source
// that is complete (every event of the instance is delivered here, in
// order, so the order scan is never needed).
func newMemoryEngine(c enginetest.Config) (enginetest.Engine, error) {
	spec, h, opts, err := engineArgs(c.Spec, c.Handler, c.Options)
	if err != nil {
		return nil, err
	}
	o := defaultOptions()
	o.registerer = prometheus.NewRegistry()
	// A retry waits for the next round (dueInRound), not for the clock:
	// the interval only has to put it in the future.
	o.newBackoff = func() backoff.BackOff { return backoff.NewConstantBackOff(time.Hour) }
	w, err := newRuntime(nil, spec, h, o, opts)
	if err != nil {
		return nil, err
	}
	w.streams = c.Streams
	w.src = completeSource{}
	w.queue.maxFailures = uint64(max(c.MaxFailures, 1))
	w.queue.inRounds = true
	w.handlerCtx = context.Background()
	if err := w.bindStore(context.Background(), c.KV); err != nil {
		return nil, err
	}
	return &memoryEngine{w: w}, nil
}

func (m *memoryEngine) Deliver(msgs []*memory.Msg, unchecked bool) {
	w := m.w
	// Every message is queued before any lane runs, as a pull of a burst
	// is: a latest-wins lane then sees all of its key's events at once.
	var runs []func()
	seqs := make([]uint64, 0, len(msgs))
	for _, msg := range msgs {
		meta, _ := msg.Metadata()
		seqs = append(seqs, meta.Sequence.Stream)
		if run := w.accept(msg, meta); run != nil {
			runs = append(runs, run)
		}
	}
	if unchecked {
		w.queue.trust(seqs)
	}
	// Rounds: each lane runs until it is empty, parked, or its head
	// fails; then the failed heads are tried again, after every other
	// lane has had its turn, as a worker's lanes run on while one backs
	// off. Each round costs a failing head an attempt, so the rounds end
	// once every head is settled or parked.
	for len(runs) > 0 {
		for _, run := range runs {
			run()
		}
		runs = runs[:0]
		for _, l := range w.queue.dueInRound() {
			runs = append(runs, w.laneRun(l))
		}
	}
	// Undecodable events are dead-lettered by tasks of their own, and acks
	// are confirmed off the lanes' path: both are waited for.
	w.tasks.Wait()
	w.settler.acks.Wait()
	// What is left is parked or queued behind a parked event: handed back,
	// as a stopping worker hands it back.
	w.releaseQueued()
}

func (m *memoryEngine) Store() *events.Store { return m.w.store }

func (m *memoryEngine) State() any { return m.w.state }

// completeSource is the memory engine's source: the caller feeds it
// (memoryEngine.Deliver), so it only says that every event of the
// instance comes here, in stream order.
type completeSource struct{}

func (completeSource) ensure(context.Context, jetstream.Stream, *events.Store) error { return nil }
func (completeSource) read(context.Context) (<-chan struct{}, error)                 { return nil, nil }
func (completeSource) stopErr() error                                                { return nil }
func (completeSource) drain()                                                        {}
func (completeSource) finish(context.Context)                                        {}
func (completeSource) complete() bool                                                { return true }
func (completeSource) ackFloor(context.Context) (uint64, error)                      { return 0, nil }
