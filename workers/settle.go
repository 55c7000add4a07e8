package workers

import (
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
)

// ack confirms a settled event. The checkpoint already says it is settled,
// so the lane goes on at once and the confirmation completes on its own: a
// lost ack only means a redelivery, which the checkpoint skips.
func (w *Runtime) ack(h *held, result string, log zerolog.Logger) {
	w.m.count(result)
	w.confirm(h, log, func(at time.Time) { w.settled(h, result, at) })
}

// supersede settles h, an event of a latest-wins kind not yet applied,
// because the event byID at sequence bySeq is newer by the worker's own
// verified ordering: the checkpoint, an outcome, the ack. It reports false
// when the checkpoint could not be written, and then h is tried again.
func (w *Runtime) supersede(h *held, byID string, bySeq uint64) bool {
	ctx, span := w.startSpan(h, "supersede")
	defer span.End()
	span.SetAttributes(attribute.String("steward.result", resultSuperseded), attribute.String("steward.superseded_by", byID))
	log := w.logFor(h)
	cp, rev, _, err := w.checkpointFor(ctx, h)
	if err == nil {
		err = w.markApplied(ctx, h, cp, rev)
	}
	if err != nil {
		log.Warn().Err(err).Msg("a superseded event could not be settled; trying again")
		return false
	}
	d := w.delivery(h, cp, rev, log)
	if err := d.Emit(ctx, OutcomeSuperseded, Superseded{
		Key: h.key, EventID: h.event.ID(), Sequence: h.seq,
		SupersededBy: byID, SupersededBySequence: bySeq,
		Reason: "superseded by " + byID,
	}); err != nil {
		// The checkpoint already settled it: the newer event carries
		// the key's state, so a missing outcome is logged, not retried.
		log.Warn().Err(err).Msg("the superseded outcome could not be published")
	}
	log.Info().Str("superseded_by", byID).Uint64("superseded_by_seq", bySeq).Msg("event superseded by a newer one of its key")
	w.ack(h, resultSuperseded, log)
	return true
}

// Settlement is what WithSettledHook reports once an event's ack is
// confirmed: the event, how it was settled, when this process received it
// and when the confirmation came back.
type Settlement struct {
	Event    event.Event
	Sequence uint64
	Result   string
	Received time.Time
	Settled  time.Time
}
