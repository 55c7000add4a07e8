package workers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// maxOrderScan bounds how many earlier events on the subject are read to
// find one of the same key; past it the checkpoint alone keeps the key
// from rolling back.
const maxOrderScan = 64

// earlierUnsettled returns the sequence of an event of the same kind and
// order key, on the same subject, stored after the last settled one and
// before h: an event another process took and has not settled (it died
// holding it, or is still working on it). Handling h first would break the
// key's stream order, so h waits for it. Zero when there is none.
//
// It costs reads of the stream, so apply asks only when such an event can
// exist: for the first event of a key this process handles, after a gap in
// the consumer sequence (deliveries went elsewhere), and for redeliveries.
// A process that has seen every delivery since it last settled the key
// holds every earlier event of it itself, and the lane orders those.
func (w *Runtime) earlierUnsettled(ctx context.Context, h *held, applied uint64) (uint64, error) {
	seq := applied + 1
	for range maxOrderScan {
		if seq >= h.seq {
			return 0, nil
		}
		m, err := w.streams.EventAt(ctx, seq, h.msg.Subject())
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("check the order of %s before sequence %d: %w", h.key, h.seq, err)
		}
		if m.Sequence >= h.seq {
			return 0, nil
		}
		// Invalid events and events of other keys never block this one:
		// they are dead-lettered or ordered on their own.
		if e, err := events.Decode(m.Header, m.Data); err == nil && w.check(m.Subject, e) == nil &&
			laneOf(e.Type(), w.spec.OrderKey(e)) == h.lane {
			return m.Sequence, nil
		}
		seq = m.Sequence + 1
	}
	return 0, nil
}

// orderWait is how long an event waits behind an earlier one of its key
// that another process holds: long enough for that process's deliveries to
// run out of the crash-loop bound, after which it would never come back.
func (w *Runtime) orderWait() time.Duration {
	return w.o.ackWait*time.Duration(w.o.maxDeliver) + time.Minute
}

// newerStored looks, under a latest-wins Spec, at the last event stored on
// h's subject: when it is an event of the same key, newer than h in the
// stream, that verifies and ranks at least as high as h, it supersedes h
// even though this process has not received it (it is on its way here, or
// another process holds it waiting behind h). That is what makes a burst
// of one key apply its newest event once, and what ends a retrying event's
// attempts when a newer one exists anywhere. It returns the newer event's
// id and sequence, or ok false.
func (w *Runtime) newerStored(ctx context.Context, h *held) (id string, seq uint64, ok bool) {
	m, err := w.streams.LastEvent(ctx, h.msg.Subject())
	if err != nil || m.Sequence <= h.seq {
		return "", 0, false
	}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil || w.check(m.Subject, e) != nil {
		return "", 0, false
	}
	key := w.spec.OrderKey(e)
	if laneOf(e.Type(), key) != h.lane {
		return "", 0, false
	}
	newer := &held{event: e, key: key, lane: h.lane, seq: m.Sequence, delivered: 1}
	rank, err := w.spec.Rank(ctx, w.delivery(newer, checkpoint{}, 0, w.logFor(newer)))
	if err != nil || rank < h.rank {
		return "", 0, false
	}
	return e.ID(), m.Sequence, true
}

// orderFloor is the sequence at or below which every event of h's lane is
// known to be settled, for the order scan: the checkpoint's, or, when the
// stored checkpoint did not verify and so counts as absent, the consumer's
// ack floor (what was acknowledged was settled), so an event does not wait
// for earlier ones that were settled long ago and will never come back.
// That costs one consumer info, only on the path of a forged document.
func (w *Runtime) orderFloor(ctx context.Context, h *held, cp checkpoint) (uint64, error) {
	if !w.cps.untrusted(h.lane) {
		return cp.Applied, nil
	}
	floor, err := w.src.ackFloor(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the ack floor of %s after the checkpoint of %s did not verify: %w", w.consumerName(), h.key, err)
	}
	return max(cp.Applied, floor), nil
}
