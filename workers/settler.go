package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
)

// settler settles deliveries once their fate is known: it moves the key's
// checkpoint and acks (a run of a lane's events with one write), waits for
// the server to confirm the ack off the lane's path, settles an event a
// newer one of its key supersedes, and dead-letters what no retry fixes,
// handing back for a redelivery what it could not settle.
type settler struct {
	*instance
	cps     *checkpointStore
	runners *runners
	// acks tracks confirmations still in flight, waited for at shutdown.
	acks sync.WaitGroup
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

// ack confirms a settled event. The checkpoint already says it is settled,
// so the lane goes on at once and the confirmation completes on its own: a
// lost ack only means a redelivery, which the checkpoint skips.
func (st *settler) ack(h *held, result string, log zerolog.Logger) {
	st.m.count(result)
	st.confirm(h, log, func(at time.Time) { st.settled(h, result, at) })
}

// supersede settles h, an event of a latest-wins kind not yet applied,
// because the event byID at sequence bySeq is newer by the worker's own
// verified ordering: its outcome now, and h joins the lane's run b, whose
// one checkpoint write and acks settle it with the run (a burst of a
// key's versions costs one write, not one a version). It returns why h
// could not be settled (its outcome not published, its lane's checkpoint
// not read), and then nothing of it is recorded: every event keeps its
// one outcome.
func (st *settler) supersede(h *held, byID string, bySeq uint64, b *batch) error {
	ctx, span := st.startSpan(h, st.supersedeSpan)
	defer span.End()
	span.SetAttributes(attribute.String("steward.result", resultSuperseded), attribute.String("steward.superseded_by", byID))
	log := st.logFor(h)
	cp, rev, ok := b.view()
	if !ok {
		var err error
		if cp, rev, _, err = st.cps.forLane(ctx, h); err != nil {
			log.Warn().Err(err).Msg("a superseded event could not be settled; trying again after a backoff")
			return err
		}
	}
	if h.handled == "" {
		// Emitted before the run's checkpoint write: a crash between
		// the two supersedes h again on its redelivery, under the same
		// outcome id, which the outcomes stream's dedupe window drops.
		// So is this one when a killed process had handled h and
		// emitted its outcome before its run's write: h keeps that one.
		d := st.delivery(h, cp, rev, log)
		if err := d.Emit(ctx, events.OutcomeSuperseded, events.Superseded{
			Key: h.key, EventID: h.event.ID(), Sequence: h.seq,
			SupersededBy: byID, SupersededBySequence: bySeq,
			Reason: "superseded by " + byID,
		}); err != nil {
			log.Warn().Err(err).Msg("the superseded outcome could not be published; superseding again after a backoff")
			return err
		}
		log.Info().Str("superseded_by", byID).Uint64("superseded_by_seq", bySeq).Msg("event superseded by a newer one of its key")
	}
	b.starting(st.now())
	b.add(h, resultSuperseded, cp, rev)
	return nil
}

// recordRun writes the checkpoint of b, a lane's run of settled events, and
// acks them; it returns the write's error, and then nothing of the run is
// acked.
func (st *settler) recordRun(b *batch) error {
	last := b.events[len(b.events)-1]
	if err := st.cps.settle(st.handlerCtx, last, b.cp, b.rev); err != nil {
		st.log.Warn().Err(err).Str("key", last.key).Int("events", len(b.events)).
			Msg("the checkpoint of a run of settled events could not be written to " + events.CheckpointBucket +
				" (is it reachable, and within its limits?); nothing of the run is acked, and it is recorded again after a backoff, not handled again")
		return err
	}
	st.ackRun(b.events)
	return nil
}

// ackRun confirms the events of a recorded run. Every ack but the last is
// sent without waiting; the last is confirmed, and since the server takes
// one connection's acks in the order they were sent, its confirmation
// confirms the run.
func (st *settler) ackRun(run []*held) {
	last := run[len(run)-1]
	for _, h := range run[:len(run)-1] {
		st.m.count(h.handled)
		if err := h.msg.Ack(); err != nil {
			log := st.logFor(h)
			log.Warn().Err(err).Msg("ack not sent; a redelivery will be skipped by the checkpoint")
		}
	}
	st.m.count(last.handled)
	st.confirm(last, st.logFor(last), func(at time.Time) {
		for _, h := range run {
			st.settled(h, h.handled, at)
		}
	})
}

// confirm acks h and waits for the server to confirm it on a runner, off
// the caller's path (the checkpoint already says h is settled), then calls
// done with the time it was confirmed. Shutdown waits for it (st.acks).
func (st *settler) confirm(h *held, log zerolog.Logger, done func(time.Time)) {
	st.acks.Add(1)
	st.runners.run(func() {
		defer st.acks.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.msg.DoubleAck(ctx); err != nil {
			log.Warn().Err(err).Msg("ack not confirmed; a redelivery will be skipped by the checkpoint")
			return
		}
		done(st.now())
	})
}

// settled reports a confirmed event to the settled hook.
func (st *settler) settled(h *held, result string, at time.Time) {
	if st.o.onSettled != nil {
		st.o.onSettled(Settlement{Event: h.event, Sequence: h.seq, Result: result, Received: h.received, Settled: at})
	}
}

// deadLetter publishes the event to the DLQ with the reason, then settles
// its key and terminates it. The letter is built by events.NewDeadLetter:
// only the original's ce-* and content headers are kept (a publisher's
// Nats-Expected-*, Nats-Rollup or Steward-* headers could otherwise fail or
// forge the write), its id carries the original's digest, and an original
// too large to copy is kept by reference. If the DLQ cannot be written, or
// already holds a different letter under this one's id, the event is kept
// and redelivered instead: nothing is dropped silently.
func (st *settler) deadLetter(h *held, reason error, log zerolog.Logger) string {
	msg := redact.Line(reason.Error())
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.handlerCtx), 10*time.Second)
	defer cancel()
	letter, digest := events.NewDeadLetter(events.LetterSource{
		Consumer:   st.consumerName(),
		DLQSubject: st.dlqSubject(),
		Stream:     events.StreamEvents,
		Sequence:   h.seq,
		Subject:    h.msg.Subject(),
		Delivered:  h.delivered,
		Reason:     msg,
		Header:     h.msg.Headers(),
		Data:       h.msg.Data(),
		MaxBytes:   st.streams.LetterLimit(ctx),
		Signer:     st.o.signer,
		Domain:     st.o.domain,
	})
	log = log.With().Str("digest", digest).Logger()
	ack, err := st.streams.Publish(ctx, letter, events.StreamDLQ)
	if err != nil {
		log.Error().Err(err).Msg("the DLQ could not be written; the event is kept and redelivered instead of dropped, and later events of its key wait for it")
		return st.keep(h, log)
	}
	if ack.Duplicate {
		// The id was seen inside the dedupe window: either this event's
		// own letter, written by a delivery that stopped before it
		// settled, or a letter someone published first under a guessed id.
		// Only the first settles the event.
		if err := st.ownLetter(ctx, ack.Sequence, letter.Header, letter.Data); err != nil {
			log.Error().Err(err).Uint64("dlq_seq", ack.Sequence).
				Msg("the DLQ holds another letter under this dead letter's id; the event is kept and redelivered until its own letter is stored (after the DLQ's dedupe window); inspect the other letter with steward dlq show")
			return st.keep(h, log)
		}
		log.Info().Uint64("dlq_seq", ack.Sequence).Msg("the event's dead letter was already stored by an earlier delivery")
	}
	if h.lane != "" && !h.invalid {
		// Settled: later events of its key must not wait for it.
		cp, rev, _, err := st.cps.forLane(ctx, h)
		if err == nil {
			err = st.cps.settle(ctx, h, cp, rev)
		}
		if err != nil {
			log.Error().Err(err).Msg("the checkpoint could not record the dead letter; the event is redelivered (its letter is recognised as its own)")
			return st.keep(h, log)
		}
	}
	if err := h.msg.TermWithReason(redact.Cut(msg, 256)); err != nil {
		log.Warn().Err(err).Msg("term failed after the event reached the DLQ; a redelivery finds its letter stored and settles it")
	}
	st.m.count(resultDead)
	log.Warn().Str("reason", msg).Uint64("dlq_seq", ack.Sequence).Msg("event sent to the DLQ")
	return resultDead
}

// ownLetter reads the letter stored at seq in the DLQ and accepts it only
// if it is the one this worker would write for this event (the same
// original, digest, kept headers and data): the reason and delivery count
// may differ between two deliveries of one event.
func (st *settler) ownLetter(ctx context.Context, seq uint64, header map[string][]string, data []byte) error {
	m, err := st.streams.Letter(ctx, seq)
	if err != nil {
		return fmt.Errorf("read back the stored letter at %s sequence %d: %w", events.StreamDLQ, seq, err)
	}
	stored := events.ParseDeadLetter(m.Sequence, m.Subject, m.Header, m.Data)
	mine := events.ParseDeadLetter(seq, st.dlqSubject(), header, data)
	if !events.SameLetter(stored, mine) {
		return fmt.Errorf("%w: %s sequence %d is on %q, written as %q for sequence %d with digest %q", errNotOwnLetter,
			events.StreamDLQ, seq, stored.DLQSubject, stored.Worker, stored.Sequence, stored.Digest)
	}
	// The same content is not enough: a letter stored ahead of this one
	// with the same original but not signed by this instance would settle
	// the event and then be shown as forged, leaving it with no letter
	// anyone believes.
	if err := stored.VerifyProof(st.o.verifier, st.o.domain); err != nil {
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
func (st *settler) keep(h *held, log zerolog.Logger) string {
	st.m.dlqFailed.Inc()
	if h.lane != "" && !h.invalid {
		st.cps.forget(h.lane)
	}
	return st.nakLater(h, log)
}

// nakLater hands an event that could not be settled back to the server for
// a redelivery after a delay, so a DLQ or bucket that is down is not
// hammered.
func (st *settler) nakLater(h *held, log zerolog.Logger) string {
	if err := h.msg.NakWithDelay(st.o.ackWait); err != nil {
		log.Warn().Err(err).Msg("nak failed; the event is redelivered after AckWait")
	}
	st.m.count(resultRetried)
	return resultRetried
}

func (st *settler) release(h *held) {
	if err := h.msg.Nak(); err != nil {
		st.log.Debug().Err(err).Uint64("seq", h.seq).Msg("nak at shutdown failed; the event is redelivered after AckWait")
	}
	st.m.count(resultReleased)
}

// errNotOwnLetter says the DLQ holds, under a letter's id, a letter that is
// not that one.
var errNotOwnLetter = errors.New("the stored letter is not this event's")
