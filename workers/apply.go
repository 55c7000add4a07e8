package workers

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/steward-dev/steward/internal/redact"
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

// process runs one delivery to its end and says what the lane does next.
// b is the lane's run of settled events not recorded yet: h joins it when
// its handler settles it, and anything else h comes to (a retry, a dead
// letter, a wait) first records the run, so it finds the checkpoint as if
// each event of the run had been recorded on its own.
func (w *Runtime) process(h *held, b *batch) verdict {
	ctx, span := w.startSpan(h, w.processSpan)
	defer span.End()
	start := w.now()
	w.validate(h)
	log := w.logFor(h)
	if h.deadReason != nil {
		w.flush(b)
		w.settler.deadLetter(h, Permanent(h.deadReason), log)
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

	if result == "" {
		switch f, reason := w.exec.classify(ctx, h, err); f {
		case fateReleased:
			w.settler.release(h)
			result = resultReleased
		case fateDead:
			result = w.settler.deadLetter(h, reason, log)
		default:
			result = resultRetried
			w.m.count(resultRetried)
			v.retry = err
		}
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
	cp, rev, inRun := b.view()
	cached := inRun
	if !inRun {
		var err error
		if cp, rev, cached, err = w.cps.forLane(ctx, h); err != nil {
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
		// applying it would roll the key back. It is acked at once, so
		// what says it was applied must be stored first: when that is
		// the lane's run, not written yet, the run is recorded now.
		// Acked above the stored checkpoint, a kill before the run's
		// write would leave this event gone from the consumer yet, to
		// the order scan, unsettled, and the key's later events waiting
		// behind it for orderWait (33 minutes in the e2e fault test,
		// whose CI run once stalled so). When the write fails, the run
		// is put back and this event is retried with it, as skipped:
		// never handled, which would apply it after the newer one.
		if inRun {
			if err := w.flush(b); err != nil {
				h.handled = resultSkipped
				return "", 0, fmt.Errorf("skip %s (event %s), older than the unrecorded applied %d: %w", h.key, h.event.ID(), cp.Applied, err)
			}
		}
		w.settler.ack(h, resultSkipped, log)
		log.Info().Uint64("applied", cp.Applied).Msg("event is older than the last applied for its key; skipped")
		return resultSkipped, 0, nil
	}
	// An earlier unsettled event of the key can only exist elsewhere if
	// this process has not seen every delivery since it last settled the
	// key (a start, a gap in the consumer sequence), or if this is a
	// redelivery; otherwise the scan is skipped (order.go).
	// A complete source (the stream reader reads every event of its
	// subjects itself, in order) leaves none to be held elsewhere. An event that already waited
	// behind one looks again, whatever the cache says.
	if !w.src.complete() && (!cached || h.delivered > 1 || !h.deferredSince.IsZero()) {
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
	result, err := w.exec.handle(ctx, d)
	if err != nil {
		return "", 0, err
	}
	b.add(h, result, d.cp, d.cpRev)
	return result, 0, nil
}
