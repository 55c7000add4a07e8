package workers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
)

// deadLetter publishes the event to the DLQ with the reason, then settles
// its key and terminates it. The letter is built by events.NewDeadLetter:
// only the original's ce-* and content headers are kept (a publisher's
// Nats-Expected-*, Nats-Rollup or Steward-* headers could otherwise fail or
// forge the write), its id carries the original's digest, and an original
// too large to copy is kept by reference. If the DLQ cannot be written, or
// already holds a different letter under this one's id, the event is kept
// and redelivered instead: nothing is dropped silently.
func (w *Runtime) deadLetter(h *held, reason error, log zerolog.Logger) string {
	msg := redact.Line(reason.Error())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.handlerCtx), 10*time.Second)
	defer cancel()
	letter, digest := events.NewDeadLetter(events.LetterSource{
		Consumer:   w.consumerName(),
		DLQSubject: w.dlqSubject(),
		Stream:     events.StreamEvents,
		Sequence:   h.seq,
		Subject:    h.msg.Subject(),
		Delivered:  h.delivered,
		Reason:     msg,
		Header:     h.msg.Headers(),
		Data:       h.msg.Data(),
		MaxBytes:   w.letterLimit(ctx),
		Signer:     w.o.signer,
		Domain:     w.o.domain,
	})
	log = log.With().Str("digest", digest).Logger()
	ack, err := w.js.PublishMsg(ctx, letter, jetstream.WithExpectStream(events.StreamDLQ))
	if err != nil {
		log.Error().Err(err).Msg("the DLQ could not be written; the event is kept and redelivered instead of dropped, and later events of its key wait for it")
		return w.keep(h, log)
	}
	if ack.Duplicate {
		// The id was seen inside the dedupe window: either this event's
		// own letter, written by a delivery that stopped before it
		// settled, or a letter someone published first under a guessed id.
		// Only the first settles the event.
		if err := w.ownLetter(ctx, ack.Sequence, letter.Header, letter.Data); err != nil {
			log.Error().Err(err).Uint64("dlq_seq", ack.Sequence).
				Msg("the DLQ holds another letter under this dead letter's id; the event is kept and redelivered until its own letter is stored (after the DLQ's dedupe window); inspect the other letter with steward dlq show")
			return w.keep(h, log)
		}
		log.Info().Uint64("dlq_seq", ack.Sequence).Msg("the event's dead letter was already stored by an earlier delivery")
	}
	if h.lane != "" && !h.invalid {
		// Settled: later events of its key must not wait for it.
		cp, rev, _, err := w.checkpointFor(ctx, h)
		if err == nil {
			err = w.markApplied(ctx, h, cp, rev)
		}
		if err != nil {
			log.Error().Err(err).Msg("the checkpoint could not record the dead letter; the event is redelivered (its letter is recognised as its own)")
			return w.keep(h, log)
		}
	}
	if err := h.msg.TermWithReason(redact.Cut(msg, 256)); err != nil {
		log.Warn().Err(err).Msg("term failed after the event reached the DLQ; a redelivery finds its letter stored and settles it")
	}
	w.m.count(resultDead)
	log.Warn().Str("reason", msg).Uint64("dlq_seq", ack.Sequence).Msg("event sent to the DLQ")
	return resultDead
}

// errNotOwnLetter says the DLQ holds, under a letter's id, a letter that is
// not that one.
var errNotOwnLetter = errors.New("the stored letter is not this event's")

// ownLetter reads the letter stored at seq in the DLQ and accepts it only
// if it is the one this worker would write for this event (the same
// original, digest, kept headers and data): the reason and delivery count
// may differ between two deliveries of one event.
func (w *Runtime) ownLetter(ctx context.Context, seq uint64, header map[string][]string, data []byte) error {
	s, err := w.js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return fmt.Errorf("read back the stored letter: stream %s: %w", events.StreamDLQ, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		return fmt.Errorf("read back the stored letter at %s sequence %d: %w", events.StreamDLQ, seq, err)
	}
	stored := events.ParseDeadLetter(m.Sequence, m.Subject, m.Header, m.Data)
	mine := events.ParseDeadLetter(seq, w.dlqSubject(), header, data)
	if !events.SameLetter(stored, mine) {
		return fmt.Errorf("%w: %s sequence %d is on %q, written as %q for sequence %d with digest %q", errNotOwnLetter,
			events.StreamDLQ, seq, stored.DLQSubject, stored.Worker, stored.Sequence, stored.Digest)
	}
	// The same content is not enough: a letter stored ahead of this one
	// with the same original but not signed by this instance would settle
	// the event and then be shown as forged, leaving it with no letter
	// anyone believes.
	if err := stored.VerifyProof(w.o.verifier, w.o.domain); err != nil {
		return fmt.Errorf("%w: %s sequence %d holds this event's letter, but %w", errNotOwnLetter, events.StreamDLQ, seq, err)
	}
	return nil
}

// keep hands an event that could not be dead-lettered back for a
// redelivery, and makes sure no later event of its key overtakes it
// meanwhile: the lane's cached checkpoint is dropped, so the next event of
// the key reads it again, finds this one stored after it and unsettled,
// and waits for it (order.go) instead of being applied and leaving this
// one to be skipped when it comes back.
func (w *Runtime) keep(h *held, log zerolog.Logger) string {
	w.m.dlqFailed.Inc()
	if h.lane != "" && !h.invalid {
		w.cps.drop(h.lane)
	}
	return w.nakLater(h, log)
}

// letterLimit is the largest dead letter that can be stored: the server's
// max payload, or the DLQ's own message size limit when that is smaller.
func (w *Runtime) letterLimit(ctx context.Context) int {
	limit := 1 << 20
	if nc := w.js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		limit = int(nc.MaxPayload())
	}
	if s, err := w.js.Stream(ctx, events.StreamDLQ); err == nil {
		if n := int(s.CachedInfo().Config.MaxMsgSize); n > 0 && n < limit {
			limit = n
		}
	}
	return limit
}

// nakLater hands an event that could not be settled back to the server for
// a redelivery after a delay, so a DLQ or bucket that is down is not
// hammered.
func (w *Runtime) nakLater(h *held, log zerolog.Logger) string {
	if err := h.msg.NakWithDelay(w.o.ackWait); err != nil {
		log.Warn().Err(err).Msg("nak failed; the event is redelivered after AckWait")
	}
	w.m.count(resultRetried)
	return resultRetried
}
