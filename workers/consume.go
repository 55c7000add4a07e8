package workers

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Run consumes until ctx is done, then shuts down: it stops pulling, naks
// what has not started (and what waits for a retry) so it is redelivered
// at once, and lets running handlers finish within the shutdown grace
// before cancelling them.
func (w *Runtime) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("worker %s is already running", w.consumerName())
	}
	defer w.running.Store(false)
	if err := w.Ensure(ctx); err != nil {
		return err
	}
	w.stopping.Store(false)
	w.stop = make(chan struct{})
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	w.handlerCtx = hctx

	done, err := w.src.read(ctx)
	if err != nil {
		return err
	}
	// Ready only once the source reads: before, a probe would call ready a
	// worker whose subscription may yet fail.
	w.consuming.Store(true)
	defer w.consuming.Store(false)
	err = w.serve(ctx, done, cancelHandlers)
	// What the handlers settled while shutting down is saved.
	w.src.finish(ctx)
	return err
}

// serve runs the lanes while the source feeds them, then shuts down as Run
// says; done closes once the source has stopped.
func (w *Runtime) serve(ctx context.Context, done <-chan struct{}, cancelHandlers context.CancelFunc) error {
	hbDone := make(chan struct{})
	hbStop := make(chan struct{})
	go w.heartbeats(hbStop, hbDone)
	w.log.Info().Str("consumer", w.consumerName()).Str("read_mode", w.o.readMode.String()).Strs("subjects", w.spec.Subjects).Msg("worker consuming")

	select {
	case <-ctx.Done():
	case <-done:
		// The connection closed for good: stop as if told to, and say so.
	}
	w.stopping.Store(true)
	close(w.stop)
	w.src.drain()
	<-done
	w.releaseQueued()

	finished := make(chan struct{})
	go func() { w.tasks.Wait(); w.settler.acks.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(w.o.shutdownGrace):
		w.log.Warn().Dur("grace", w.o.shutdownGrace).Msg("handlers still running after the shutdown grace; cancelling them")
		cancelHandlers()
		<-finished
	}
	close(hbStop)
	<-hbDone
	if err := w.src.stopErr(); err != nil {
		w.log.Error().Err(err).Msg("worker stopped")
		return err
	}
	w.log.Info().Msg("worker stopped")
	return nil
}

// accept takes a message from the source, with its metadata, and queues it
// behind its key.
// When that gives a lane work and the lane has no runner, it claims the
// lane and returns what runs it, for the caller to run (taker.go) or hand
// to a runner; otherwise nil.
func (w *Runtime) accept(msg jetstream.Msg, meta *jetstream.MsgMetadata) (run func()) {
	h := &held{msg: msg, seq: meta.Sequence.Stream, delivered: meta.NumDelivered, received: w.now()}
	if w.stopping.Load() {
		w.settler.release(h)
		return nil
	}
	if meta.NumDelivered > 1 {
		w.m.redelivered.Inc()
	}

	// Only decoded here, the one step every event takes in turn: the
	// validation (the schema, the type, the subject) runs in the event's lane
	// (validate), so a burst is checked on every core. A lane is then
	// chosen from an event not validated yet; an invalid one only passes
	// through its lane on its way to the DLQ, never moving its checkpoint.
	e, err := events.Decode(msg.Headers(), msg.Data())
	if err != nil {
		// Nothing a retry can fix: straight to the DLQ, off the key lanes
		// (an event that does not decode has no key).
		h.key = "invalid"
		w.queue.hold(h)
		w.m.inFlight.Inc()
		w.tasks.Add(1)
		w.runners.run(func() {
			defer w.tasks.Done()
			defer w.unhold(h)
			w.settler.deadLetter(h, Permanent(err), w.log.With().Uint64("seq", h.seq).Logger())
		})
		return nil
	}
	h.event, h.key = e, w.spec.OrderKey(e)
	h.lane = laneOf(e.Type(), h.key)
	if h.delivered > uint64(w.o.maxDeliver) {
		// Dead-lettered in its turn, so that the checkpoint it settles
		// never skips an earlier event of its key.
		h.deadReason = fmt.Errorf("delivered %d times and never settled: every process that took it stopped before it did (a crash loop), so it is set aside", h.delivered)
	}

	added, claimed := w.queue.add(h)
	if added {
		w.m.inFlight.Inc()
	}
	if claimed == nil {
		return nil
	}
	return w.laneRun(claimed)
}

// validate runs check on h once, in its lane, by the lane's runner on an
// event it has taken off the queue (accept no longer sees it there).
func (w *Runtime) validate(h *held) {
	if !h.validated {
		h.setValidity(w.check(h.msg.Subject(), h.event))
	}
}

// setValidity records what check said of h. An invalid event goes to the
// DLQ in its turn, off its lane's order: it has no trustworthy key, so it
// neither moves the lane's checkpoint nor ranks, supersedes or is
// superseded.
func (h *held) setValidity(err error) {
	h.validated = true
	if err != nil {
		h.deadReason, h.invalid, h.key = err, true, "invalid"
		h.rankDone, h.ranked = true, false
	}
}
