package bench

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
)

// runtimePath names the runtime's path as the report, its progress lines
// and errors do.
const runtimePath = "runtime (no-op worker)"

// Runtime publishes the events to STEWARD_EVENTS and waits until the
// runtime, running a worker whose handler does nothing, has settled every
// one.
func (e *Env) Runtime(ctx context.Context, o Options) (Measure, error) {
	return e.consume(ctx, o, runtimePath, events.StreamEvents, nil, func(ctx context.Context, t *tracker) (func(), error) {
		spec := workers.Spec{
			Name: "bench", Instance: "run" + strconv.Itoa(e.runs),
			Subjects: []string{events.EventsPrefix + ".credential.rotated.>"},
			Types:    []string{events.TypeCredentialRotated},
		}
		opts := []workers.Option{
			workers.WithRegisterer(prometheus.NewRegistry()),
			workers.WithSettledHook(func(s workers.Settlement) { t.settle(s.Event.ID()) }),
		}
		if o.Concurrency > 0 {
			opts = append(opts, workers.WithConcurrency(o.Concurrency))
		}
		w, err := workers.New(e.subJS, spec, workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
			t.handle(d.Event.ID())
			return nil
		}), opts...)
		if err != nil {
			return nil, err
		}
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(runCtx) }()
		stop := func() {
			cancel()
			<-done
			e.deleteConsumer(events.StreamEvents, w.ConsumerName())
		}
		for w.Ready() != nil {
			select {
			case <-ctx.Done():
				stop()
				return nil, fmt.Errorf("the bench worker did not start: %w", ctx.Err())
			case <-time.After(5 * time.Millisecond):
			}
		}
		return stop, nil
	})
}
