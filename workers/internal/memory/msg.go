package memory

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Settle is what became of a Msg: nothing yet, or how the engine settled it.
type Settle string

// What the engine can do with a message.
const (
	Pending Settle = ""
	// Acked: settled (Ack or DoubleAck).
	Acked Settle = "acked"
	// Termed: settled for good without being applied (the DLQ has it).
	Termed Settle = "termed"
	// Naked: handed back for a redelivery (NakWithDelay included).
	Naked Settle = "naked"
)

// Msg is an event stored in STEWARD_EVENTS as a consumer delivers it, in
// memory: it records how the engine settles it, and nothing redelivers it.
type Msg struct {
	raw       *jetstream.RawStreamMsg
	delivered uint64

	mu     sync.Mutex
	settle Settle
	reason string
}

// NewMsg is the delivery of raw, for the delivered-th time.
func NewMsg(raw *jetstream.RawStreamMsg, delivered uint64) *Msg {
	return &Msg{raw: raw, delivered: max(delivered, 1)}
}

// Settled is how the engine settled the message, and the reason it gave a
// term.
func (m *Msg) Settled() (Settle, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.settle, m.reason
}

func (m *Msg) set(s Settle, reason string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.settle == Pending {
		m.settle, m.reason = s, reason
	}
	return nil
}

// Metadata is what a consumer's delivery carries.
func (m *Msg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: m.raw.Sequence, Consumer: m.raw.Sequence},
		NumDelivered: m.delivered,
		Timestamp:    m.raw.Time,
		Stream:       events.StreamEvents,
	}, nil
}

func (m *Msg) Data() []byte                       { return m.raw.Data }
func (m *Msg) Headers() nats.Header               { return m.raw.Header }
func (m *Msg) Subject() string                    { return m.raw.Subject }
func (m *Msg) Reply() string                      { return "" }
func (m *Msg) Ack() error                         { return m.set(Acked, "") }
func (m *Msg) DoubleAck(context.Context) error    { return m.Ack() }
func (m *Msg) Nak() error                         { return m.set(Naked, "") }
func (m *Msg) NakWithDelay(time.Duration) error   { return m.Nak() }
func (m *Msg) InProgress() error                  { return nil }
func (m *Msg) Term() error                        { return m.set(Termed, "") }
func (m *Msg) TermWithReason(reason string) error { return m.set(Termed, reason) }
