package memory

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

func msg(subject, id string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = []byte(id)
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	return m
}

// TestStreamsStoreOnceByID: a publish whose Nats-Msg-Id is stored is
// acknowledged as a duplicate of the first, as inside a dedupe window;
// Append stores whatever the id, as a publish after the window.
func TestStreamsStoreOnceByID(t *testing.T) {
	ctx := context.Background()
	s := NewStreams()
	a, err := s.Publish(ctx, msg("steward.dlq.w.i", "x"), events.StreamDLQ)
	if err != nil || a.Sequence != 1 || a.Duplicate {
		t.Fatalf("first publish: %+v %v", a, err)
	}
	b, err := s.Publish(ctx, msg("steward.dlq.w.i", "x"), events.StreamDLQ)
	if err != nil || b.Sequence != 1 || !b.Duplicate {
		t.Fatalf("the same id again: %+v %v, want a duplicate of sequence 1", b, err)
	}
	if got := len(s.Messages(events.StreamDLQ)); got != 1 {
		t.Fatalf("%d letters stored, want 1", got)
	}
	if seq := s.Append(events.StreamDLQ, msg("steward.dlq.w.i", "x")); seq != 2 {
		t.Fatalf("append stored at %d, want 2", seq)
	}
	if m, err := s.Letter(ctx, 2); err != nil || m.Sequence != 2 {
		t.Fatalf("letter 2: %v %v", m, err)
	}
	full := errors.New("stream full")
	s.Fail = func(*nats.Msg, string) error { return full }
	if _, err := s.Publish(ctx, msg("steward.dlq.w.i", "y"), events.StreamDLQ); !errors.Is(err, full) {
		t.Fatalf("a failing publish: %v", err)
	}
	if got := len(s.Messages(events.StreamDLQ)); got != 2 {
		t.Fatalf("a failing publish stored something: %d letters", got)
	}
}

// TestStreamsFindEventsBySubject: the order scan reads the first event at
// or after a sequence on a subject, the supersede check the last one.
func TestStreamsFindEventsBySubject(t *testing.T) {
	ctx := context.Background()
	s := NewStreams()
	for _, subj := range []string{"e.a", "e.b", "e.a", "e.b"} {
		s.Append(events.StreamEvents, msg(subj, ""))
	}
	if m, err := s.EventAt(ctx, 2, "e.a"); err != nil || m.Sequence != 3 {
		t.Fatalf("event at 2 on e.a: %v %v, want sequence 3", m, err)
	}
	if _, err := s.EventAt(ctx, 4, "e.a"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("event at 4 on e.a: %v, want not found", err)
	}
	if m, err := s.LastEvent(ctx, "e.b"); err != nil || m.Sequence != 4 {
		t.Fatalf("last on e.b: %v %v, want 4", m, err)
	}
	if _, err := s.LastEvent(ctx, "e.c"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("last on e.c: %v, want not found", err)
	}
}

// TestMsgKeepsTheFirstSettling: the engine settles a message once; what it
// says first is what it did.
func TestMsgKeepsTheFirstSettling(t *testing.T) {
	m := NewMsg(&jetstream.RawStreamMsg{Subject: "e.a", Sequence: 7}, 2)
	meta, _ := m.Metadata()
	if meta.Sequence.Stream != 7 || meta.NumDelivered != 2 {
		t.Fatalf("metadata %+v", meta)
	}
	if s, _ := m.Settled(); s != Pending {
		t.Fatalf("settled %q before anything", s)
	}
	_ = m.TermWithReason("bad data")
	_ = m.Nak()
	if s, reason := m.Settled(); s != Termed || reason != "bad data" {
		t.Fatalf("settled %q (%q), want termed with its reason", s, reason)
	}
}
