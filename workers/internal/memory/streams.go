package memory

import (
	"context"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Streams are JetStream streams in memory, by name: each message stored
// gets the stream's next sequence, and a message whose Nats-Msg-Id the
// stream already holds is not stored again (the publish acknowledgement
// says Duplicate and names the first), as inside a stream's dedupe window.
// It is the engine's streams seam in memory (workers' streams.go).
type Streams struct {
	// Fail, when set, is asked before every publish; an error it returns
	// is the publish's, and nothing is stored.
	Fail func(msg *nats.Msg, stream string) error

	mu      sync.Mutex
	streams map[string]*stream
}

type stream struct {
	msgs []*jetstream.RawStreamMsg
	ids  map[string]uint64
}

// NewStreams returns empty streams.
func NewStreams() *Streams { return &Streams{streams: map[string]*stream{}} }

func (s *Streams) named(name string) *stream {
	st := s.streams[name]
	if st == nil {
		st = &stream{ids: map[string]uint64{}}
		s.streams[name] = st
	}
	return st
}

// Append stores msg in the stream name whatever its Nats-Msg-Id, as a
// message published again after the dedupe window, and returns its
// sequence.
func (s *Streams) Append(name string, msg *nats.Msg) uint64 {
	seq, _ := s.store(name, msg, false)
	return seq
}

// store stores msg in the stream name and returns its sequence; with
// dedupe, a message whose id is stored returns the first's, duplicate.
func (s *Streams) store(name string, msg *nats.Msg, dedupe bool) (seq uint64, duplicate bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.named(name)
	id := msg.Header.Get(jetstream.MsgIDHeader)
	if first, ok := st.ids[id]; ok && id != "" && dedupe {
		return first, true
	}
	seq = uint64(len(st.msgs)) + 1
	st.msgs = append(st.msgs, &jetstream.RawStreamMsg{
		Subject: msg.Subject, Sequence: seq, Header: maps.Clone(msg.Header), Data: append([]byte(nil), msg.Data...), Time: time.Now(),
	})
	if id != "" {
		st.ids[id] = seq
	}
	return seq, false
}

// Messages returns what the stream name holds, in order.
func (s *Streams) Messages(name string) []*jetstream.RawStreamMsg {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*jetstream.RawStreamMsg(nil), s.named(name).msgs...)
}

// Publish stores msg in stream, as a publish that expects that stream.
func (s *Streams) Publish(_ context.Context, msg *nats.Msg, stream string) (*jetstream.PubAck, error) {
	if s.Fail != nil {
		if err := s.Fail(msg, stream); err != nil {
			return nil, err
		}
	}
	seq, dup := s.store(stream, msg, true)
	return &jetstream.PubAck{Stream: stream, Sequence: seq, Duplicate: dup}, nil
}

// LetterLimit is the largest dead letter stored: the server's default
// max payload.
func (s *Streams) LetterLimit(context.Context) int { return 1 << 20 }

// Letter is the message stored in STEWARD_DLQ at seq.
func (s *Streams) Letter(_ context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return s.at(events.StreamDLQ, seq, "")
}

// EventAt is the first event stored in STEWARD_EVENTS at or after seq on
// subject; jetstream.ErrMsgNotFound when none is.
func (s *Streams) EventAt(_ context.Context, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	return s.at(events.StreamEvents, seq, subject)
}

// LastEvent is the last event stored on subject.
func (s *Streams) LastEvent(_ context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msgs := s.named(events.StreamEvents).msgs
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Subject == subject {
			return msgs[i], nil
		}
	}
	return nil, jetstream.ErrMsgNotFound
}

func (s *Streams) at(name string, seq uint64, subject string) (*jetstream.RawStreamMsg, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Sequences start at 1 and are the messages' places, one after the
	// other: the first at or after seq is at index seq-1.
	msgs := s.named(name).msgs
	for i := max(seq, 1) - 1; i < uint64(len(msgs)); i++ {
		if subject == "" || msgs[i].Subject == subject {
			return msgs[i], nil
		}
	}
	return nil, jetstream.ErrMsgNotFound
}
