package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// RawConsumer is how a raw path's consumer treats each event.
type RawConsumer int

const (
	// Ack acks each event fire-and-forget.
	Ack RawConsumer = iota
	// DoubleAck confirms each ack before the next event: a serial consumer
	// that wants to know its ack landed.
	DoubleAck
	// ValidatingDoubleAck decodes and validates each event as the runtime
	// does (events.Decode, events.Validate) before its handler, then
	// confirms its ack as DoubleAck does.
	ValidatingDoubleAck
)

// String names the consumer as the report, its progress lines and errors
// do.
func (c RawConsumer) String() string {
	return [...]string{"raw Ack", "raw serial DoubleAck", "raw validating DoubleAck"}[c]
}

// rawName names the raw path of consumer c on layout l.
func rawName(c RawConsumer, l Layout) string { return c.String() + ", " + l.String() }

// Raw publishes the same kind of events to the stream of layout l and
// consumes them with a durable pull consumer as nats.go makes one, treating
// each event as c says.
func (e *Env) Raw(ctx context.Context, o Options, c RawConsumer, l Layout) (Measure, error) {
	// invalid holds the first event the validating consumer refused.
	var invalid atomic.Pointer[error]
	m, err := e.consume(ctx, o, rawName(c, l), l.stream(), l.reshape, func(ctx context.Context, t *tracker) (func(), error) {
		cons, err := e.subJS.CreateOrUpdateConsumer(ctx, l.stream(), jetstream.ConsumerConfig{
			Durable:   "raw-" + strconv.Itoa(e.runs),
			AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			return nil, err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			id := m.Headers().Get(idHeader)
			if c == ValidatingDoubleAck {
				ev, err := events.Decode(m.Headers(), m.Data())
				if err == nil {
					err = events.Validate(ev)
				}
				if err != nil {
					// Every event was validated when it was made, so this
					// is the bench's own fault: the event never settles,
					// and the path's timeout says why.
					err = fmt.Errorf("event %s: %w", id, err)
					invalid.CompareAndSwap(nil, &err)
					return
				}
			}
			t.handle(id)
			if c == Ack {
				if m.Ack() != nil {
					return
				}
			} else if m.DoubleAck(ctx) != nil {
				return
			}
			t.settle(id)
		})
		if err != nil {
			e.deleteConsumer(l.stream(), cons.CachedInfo().Name)
			return nil, err
		}
		return func() {
			cc.Stop()
			e.deleteConsumer(l.stream(), cons.CachedInfo().Name)
		}, nil
	})
	if why := invalid.Load(); err != nil && why != nil {
		return Measure{}, fmt.Errorf("%w; the first event that did not validate: %w", err, *why)
	}
	return m, err
}
