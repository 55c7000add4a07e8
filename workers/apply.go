package workers

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/internal/tracing"
)

// verdict is what the lane does with a delivery once process returns:
// nothing (it is settled or handed back), nothing yet (batched: settled,
// its checkpoint and ack to come with the lane's run), retry it (after its
// backoff), or keep it waiting behind an earlier event of its key
// (behind).
type verdict struct {
	batched bool
	retry   error
	behind  uint64
}

// logFor is the logger of one delivery, with the fields docs/design.md §4 names.
func (w *Runtime) logFor(h *held) zerolog.Logger {
	if w.log.GetLevel() == zerolog.Disabled {
		// Nothing is written: the fields would only be allocated.
		return w.log
	}
	return w.log.With().
		Str("key", h.key).Str("event_id", h.event.ID()).Str("type", h.event.Type()).
		Uint64("seq", h.seq).Uint64("delivery", h.delivered).Uint64("attempt", h.delivered+h.attempts).Logger()
}

// process runs one delivery to its end and says what the lane does next.
// b is the lane's run of settled events not recorded yet: h joins it when
// its handler settles it, and anything else h comes to (a retry, a dead
// letter, a wait) first records the run, so it finds the checkpoint as if
// each event of the run had been recorded on its own.
func (w *Runtime) process(h *held, b *batch) verdict {
	ctx, span := w.startSpan(h, "process")
	defer span.End()
	start := w.now()
	w.validate(h)
	log := w.logFor(h)
	if h.deadReason != nil {
		w.flush(b)
		w.deadLetter(h, Permanent(h.deadReason), log)
		span.SetAttributes(attribute.String("steward.result", resultDead))
		return verdict{}
	}
	b.starting(start)
	result, behind, err := w.apply(ctx, h, b, log)
	v := verdict{batched: b.holds(h)}
	if !v.batched {
		w.flush(b)
	}
	defer func() {
		span.SetAttributes(attribute.String("steward.result", result))
		if err != nil && result != resultRefused {
			span.SetStatus(codes.Error, redact.Line(err.Error()))
		}
	}()
	elapsed := w.now().Sub(start)
	w.m.duration.Observe(elapsed.Seconds())

	var p *panicError
	switch {
	case result != "":
	case ctx.Err() != nil:
		w.release(h)
		result = resultReleased
	case IsPermanent(err):
		result = w.deadLetter(h, err, log)
	case errors.As(err, &p) && h.panics+1 >= w.o.maxPanics:
		h.panics++
		result = w.deadLetter(h, Permanent(fmt.Errorf("the handler panicked %d times, the last with: %w", h.panics, err)), log)
	default:
		if p != nil {
			h.panics++
		}
		result = resultRetried
		w.m.count(resultRetried)
		v.retry = err
	}
	ev := log.Info()
	if err != nil {
		ev = log.Warn().Str("error", redact.Line(err.Error()))
	}
	if behind != 0 {
		ev = ev.Uint64("behind", behind)
		v.behind = behind
	}
	ev.Str("outcome", result).Dur("duration", elapsed).Msg("delivery handled")
	return v
}

// apply checks the checkpoint and the order and runs the handler. It
// returns a result when the delivery is settled (applied or refused: it
// joined b, to be recorded and acked with the lane's run; skipped: acked)
// or deferred (with the sequence it waits behind), or the handler's error.
func (w *Runtime) apply(ctx context.Context, h *held, b *batch, log zerolog.Logger) (string, uint64, error) {
	cp, rev, cached := b.view()
	if !cached {
		var err error
		if cp, rev, cached, err = w.checkpointFor(ctx, h); err != nil {
			return "", 0, err
		}
	}
	if h.handled != "" {
		// The handler already ran in this process and only recording it
		// failed (the bucket was unreachable, or a read of it lagged):
		// record it again rather than run the handler a second time.
		b.add(h, h.handled, cp, rev)
		return h.handled, 0, nil
	}
	if h.seq <= cp.Applied {
		// A late redelivery of something older than what was applied:
		// applying it would roll the key back.
		w.ack(h, resultSkipped, log)
		log.Info().Uint64("applied", cp.Applied).Msg("event is older than the last applied for its key; skipped")
		return resultSkipped, 0, nil
	}
	// An earlier unsettled event of the key can only exist elsewhere if
	// this process has not seen every delivery since it last settled the
	// key (a start, a gap in the consumer sequence), or if this is a
	// redelivery; otherwise the scan is skipped (order.go).
	// The stream reader reads every event of its subjects itself, in
	// order, so none can be held elsewhere. An event that already waited
	// behind one looks again, whatever the cache says.
	if w.reader == nil && (!cached || h.delivered > 1 || !h.deferredSince.IsZero()) {
		floor, err := w.orderFloor(ctx, h, cp)
		if err != nil {
			return "", 0, err
		}
		behind, err := w.earlierUnsettled(ctx, h, floor)
		if err != nil {
			return "", 0, err
		}
		if behind != 0 {
			now := w.now()
			if h.deferredSince.IsZero() {
				h.deferredSince = now
			}
			if waited := now.Sub(h.deferredSince); waited < w.orderWait() {
				return resultDeferred, behind, nil
			}
			log.Warn().Uint64("behind", behind).Dur("waited", now.Sub(h.deferredSince)).
				Msg("an earlier event of this key has not settled in time; handling this one without it, and the earlier one is skipped if it comes back")
		}
	}
	d := w.delivery(h, cp, rev, log)
	result := resultApplied
	if err := w.call(ctx, d); IsRefused(err) {
		// A refusal settles the event as an application does: its
		// outcome is out, and a redelivery would be refused again.
		result = resultRefused
		log.Info().Str("reason", redact.Line(err.Error())).Msg("event refused by the worker's rules")
	} else if err != nil {
		return "", 0, err
	}
	b.add(h, result, d.cp, d.cpRev)
	return result, 0, nil
}

// delivery is what the handler (or Rank) is given for h.
func (w *Runtime) delivery(h *held, cp checkpoint, rev uint64, log zerolog.Logger) *Delivery {
	return &Delivery{
		Event: h.event, Key: h.key, Sequence: h.seq, Attempt: h.delivered + h.attempts, Log: log,
		backend: (*runtimeBackend)(w), name: w.spec.Name, instance: w.spec.Instance, noun: w.spec.OutcomeNoun, now: w.o.now,
		lane: h.lane, cp: cp, cpRev: rev,
	}
}

// startSpan starts the span of one delivery (or of settling it as
// superseded) in the trace of its publisher, as the CloudEvents tracing
// extension carries it, with OpenTelemetry's messaging and CloudEvents
// attributes. The handler gets its context, so outcomes continue it. The
// attributes are set only on a span that records: building them for every
// event where nothing traces cost more than the rest of the span.
func (w *Runtime) startSpan(h *held, operation string) (context.Context, trace.Span) {
	ctx, span := w.tracer.Start(tracing.Extract(w.handlerCtx, h.event), operation+" "+w.consumerName(),
		trace.WithSpanKind(trace.SpanKindConsumer))
	if !span.IsRecording() {
		return ctx, span
	}
	span.SetAttributes(tracing.EventAttributes(h.event)...)
	span.SetAttributes(
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.operation.type", "process"),
		attribute.String("messaging.operation.name", operation),
		attribute.String("messaging.destination.name", h.msg.Subject()),
		attribute.String("messaging.consumer.group.name", w.consumerName()),
		attribute.String("messaging.message.id", h.event.ID()),
		attribute.String("steward.worker", w.spec.Name),
		attribute.String("steward.instance", w.spec.Instance),
		attribute.String("steward.key", h.key),
		attribute.Int64("steward.stream.sequence", int64(h.seq)),
		attribute.Int64("steward.attempt", int64(h.delivered+h.attempts)),
	)
	return ctx, span
}

// panicError is a handler panic turned into a failure.
type panicError struct{ msg string }

func (p *panicError) Error() string { return p.msg }

// call runs the handler and turns a panic into an ordinary failure.
func (w *Runtime) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.m.panics.Inc()
			d.Log.Error().Str("panic", redact.Line(fmt.Sprint(r))).Str("stack", string(debug.Stack())).Msg("handler panicked")
			err = &panicError{msg: fmt.Sprintf("handler panicked on %s (event %s): %v", d.Key, d.Event.ID(), r)}
		}
	}()
	return w.handler.Handle(ctx, d)
}
