package workers

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
)

// deadLetter publishes the event with its headers and the reason to the
// DLQ, then terminates it. If the DLQ cannot be written the event is
// retried instead: nothing is dropped silently.
func (w *Worker) deadLetter(h *held, reason error, log zerolog.Logger) string {
	dl := nats.NewMsg(w.dlqSubject())
	for k, v := range h.msg.Headers() {
		dl.Header[k] = append([]string(nil), v...)
	}
	dl.Header.Set(nats.MsgIdHdr, "dlq-"+w.consumerName()+"-"+strconv.FormatUint(h.seq, 10))
	msg := elideSecrets(oneLine(reason.Error()))
	dl.Header.Set(events.HeaderError, msg)
	dl.Header.Set(events.HeaderWorker, w.consumerName())
	dl.Header.Set(events.HeaderStreamSeq, strconv.FormatUint(h.seq, 10))
	dl.Header.Set(events.HeaderDelivered, strconv.FormatUint(h.delivered, 10))
	dl.Header.Set(events.HeaderSubject, h.msg.Subject())
	dl.Data = h.msg.Data()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.handlerCtx), 10*time.Second)
	defer cancel()
	if _, err := w.js.PublishMsg(ctx, dl, jetstream.WithExpectStream(events.StreamDLQ)); err != nil {
		log.Error().Err(err).Msg("the DLQ could not be written; the event is kept and redelivered instead of dropped")
		return w.nakLater(h, log)
	}
	if h.lane != "" {
		// Settled: later events of its key must not wait for it.
		cp, rev, _, err := w.checkpointFor(ctx, h)
		if err == nil {
			err = w.markApplied(ctx, h, cp, rev)
		}
		if err != nil {
			log.Error().Err(err).Msg("the checkpoint could not record the dead letter; the event is redelivered (the DLQ deduplicates it)")
			return w.nakLater(h, log)
		}
	}
	if err := h.msg.TermWithReason(truncate(msg, 256)); err != nil {
		log.Warn().Err(err).Msg("term failed after the event reached the DLQ; a redelivery is deduplicated there")
	}
	w.m.count(resultDead)
	log.Warn().Str("reason", msg).Msg("event sent to the DLQ")
	return resultDead
}

// nakLater hands an event that could not be settled back to the server for
// a redelivery after a delay, so a DLQ or bucket that is down is not
// hammered.
func (w *Worker) nakLater(h *held, log zerolog.Logger) string {
	if err := h.msg.NakWithDelay(w.o.ackWait); err != nil {
		log.Warn().Err(err).Msg("nak failed; the event is redelivered after AckWait")
	}
	w.m.count(resultRetried)
	return resultRetried
}
