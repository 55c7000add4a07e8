package workers

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// streams is everything the engine asks of the server beyond its source
// and its bucket: publishing an outcome or a dead letter, the largest
// letter the DLQ stores, reading back a stored letter, and the events
// stored on a subject (the order and supersede checks, order.go). It is
// one narrow seam so that the engine runs over memory too, with no rule
// written twice: jetStreams is the runtime's, memory.Streams workertest's
// (the methods are exported so that a type of another package can be one).
type streams interface {
	// Publish stores msg, which must land in stream.
	Publish(ctx context.Context, msg *nats.Msg, stream string) (*jetstream.PubAck, error)
	// LetterLimit is the largest dead letter that can be stored.
	LetterLimit(ctx context.Context) int
	// Letter is the message stored in STEWARD_DLQ at seq.
	Letter(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error)
	// EventAt is the first event stored in STEWARD_EVENTS at or after seq
	// on subject; an error wrapping jetstream.ErrMsgNotFound when none is.
	EventAt(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error)
	// LastEvent is the last event stored on subject.
	LastEvent(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error)
}

// jetStreams is streams on JetStream. events is STEWARD_EVENTS, bound by
// Ensure (the order and supersede checks run only once it has).
type jetStreams struct {
	js     jetstream.JetStream
	events jetstream.Stream
}

func (s *jetStreams) Publish(ctx context.Context, msg *nats.Msg, stream string) (*jetstream.PubAck, error) {
	return s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(stream))
}

// LetterLimit is the server's max payload, or the DLQ's own message size
// limit when that is smaller.
func (s *jetStreams) LetterLimit(ctx context.Context) int {
	limit := 1 << 20
	if nc := s.js.Conn(); nc != nil && nc.MaxPayload() > 0 {
		limit = int(nc.MaxPayload())
	}
	if st, err := s.js.Stream(ctx, events.StreamDLQ); err == nil {
		if n := int(st.CachedInfo().Config.MaxMsgSize); n > 0 && n < limit {
			limit = n
		}
	}
	return limit
}

func (s *jetStreams) Letter(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	st, err := s.js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return nil, err
	}
	return st.GetMsg(ctx, seq)
}

func (s *jetStreams) EventAt(ctx context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	if s.events == nil {
		return nil, errStreamUnbound
	}
	return s.events.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
}

func (s *jetStreams) LastEvent(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if s.events == nil {
		return nil, errStreamUnbound
	}
	return s.events.GetLastMsgForSubject(ctx, subject)
}

// errStreamUnbound says STEWARD_EVENTS was read before Ensure bound it.
var errStreamUnbound = errors.New(events.StreamEvents + " is not bound yet (Ensure binds it)")
