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

// runtimePath, outcomePath and runtimeNoNoticesPath name the runtime's
// paths as the report, its progress lines and errors do.
const (
	runtimePath          = "runtime (no-op worker)"
	outcomePath          = "runtime, emitting an outcome"
	runtimeNoNoticesPath = "runtime, no stored notices"
	runtimeUpdatedPath   = "runtime, stream updated"
)

// Runtime publishes the events to STEWARD_EVENTS and waits until the
// runtime, running a worker whose handler does nothing, has settled every
// one.
func (e *Env) Runtime(ctx context.Context, o Options) (Measure, error) {
	return e.runtime(ctx, o, runtimePath, false)
}

// RuntimeOutcome is Runtime with a handler that emits one outcome per
// event, as every real worker does: the outcome is signed by the
// instance's key (docs/design.md §7) and published to STEWARD_OUTCOMES with
// a confirmed publish before the handler returns, so what signing and
// storing an outcome cost shows against Runtime in the same run.
func (e *Env) RuntimeOutcome(ctx context.Context, o Options) (Measure, error) {
	return e.runtime(ctx, o, outcomePath, true)
}

// RuntimeWithoutNotices is Runtime on the streams `steward setup
// --stored-notices none` makes: STEWARD_EVENTS republishes no stored
// notices during the turn, and is set up again as before it once the turn
// is over. It is held against RuntimeAfterUpdate, not Runtime, so that
// the two turns differ in the notices alone: the update before its turn
// once seemed to lower the turn's p99 as much as their absence, which
// larger probes did not bear out (docs/benchmarks.md, 2026-12-07,
// midday).
func (e *Env) RuntimeWithoutNotices(ctx context.Context, o Options) (m Measure, err error) {
	with, without := noticeConfigs()
	if err := events.EnsureStreams(ctx, e.pubJS, without); err != nil {
		return Measure{}, fmt.Errorf("set up the streams without stored notices: %w", err)
	}
	defer func() {
		if serr := events.EnsureStreams(context.WithoutCancel(ctx), e.pubJS, with); serr != nil && err == nil {
			err = fmt.Errorf("set up the streams with their stored notices again: %w", serr)
		}
	}()
	return e.runtime(ctx, o, runtimeNoNoticesPath, false)
}

// RuntimeAfterUpdate is Runtime just after STEWARD_EVENTS is updated as
// RuntimeWithoutNotices updates it, without its stored notices and back,
// so that the two turns differ only in the notices: the control that says
// what they cost.
func (e *Env) RuntimeAfterUpdate(ctx context.Context, o Options) (Measure, error) {
	with, without := noticeConfigs()
	for _, c := range []events.StreamConfig{without, with} {
		if err := events.EnsureStreams(ctx, e.pubJS, c); err != nil {
			return Measure{}, fmt.Errorf("update the streams before the turn: %w", err)
		}
	}
	return e.runtime(ctx, o, runtimeUpdatedPath, false)
}

// noticeConfigs are the streams as setUp made them, and the same without
// stored notices. Only the streams: the bucket stays as setUp left it.
func noticeConfigs() (with, without events.StreamConfig) {
	with = events.DefaultBusConfig(1).Streams
	without = with
	without.Notices = ""
	return with, without
}

// benchApplied is the outcome RuntimeOutcome's handler emits: about the
// size of a real worker's (credential.applied carries a version and a
// client id).
type benchApplied struct {
	Version  uint64 `json:"version"`
	ClientID string `json:"clientId"`
}

func (e *Env) runtime(ctx context.Context, o Options, name string, emit bool) (Measure, error) {
	return e.consume(ctx, o, name, events.StreamEvents, nil, func(ctx context.Context, t *tracker) (func(), error) {
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
		w, err := workers.New(e.subJS, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
			t.handle(d.Event.ID())
			if emit {
				return d.Emit(ctx, "applied", benchApplied{Version: d.Sequence, ClientID: "bench"})
			}
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
