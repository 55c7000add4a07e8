package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
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
	// CheckpointingDoubleAck is ValidatingDoubleAck that, once its handler
	// has run, writes the event's stream sequence as its key's checkpoint,
	// compare-and-set on the revision it last wrote, into a key-value
	// bucket made as a nats.go user makes one, and only then confirms the
	// ack: the least a consumer of its own does to keep the runtime's
	// "nothing applied is lost" (the checkpoint before the ack, DESIGN.md
	// §4), without the signature Steward puts on its checkpoints.
	CheckpointingDoubleAck
)

// rawCheckpointBucket holds CheckpointingDoubleAck's checkpoints: a name,
// file storage, nats.go's defaults for the rest.
const rawCheckpointBucket = "BENCH_CHECKPOINTS"

// String names the consumer as the report, its progress lines and errors
// do.
func (c RawConsumer) String() string {
	return [...]string{"raw Ack", "raw serial DoubleAck", "raw validating DoubleAck", "raw checkpointing DoubleAck"}[c]
}

// validates says whether the consumer decodes and validates each event
// before its handler, as every worker must.
func (c RawConsumer) validates() bool { return c >= ValidatingDoubleAck }

// rawName names the raw path of consumer c on layout l.
func rawName(c RawConsumer, l Layout) string { return c.String() + ", " + l.String() }

// Raw publishes the same kind of events to the stream of layout l and
// consumes them with a durable pull consumer as nats.go makes one, treating
// each event as c says.
func (e *Env) Raw(ctx context.Context, o Options, c RawConsumer, l Layout) (Measure, error) {
	// unsettled holds the first event the consumer could not settle: one
	// that did not validate, or whose checkpoint was not written.
	var unsettled atomic.Pointer[error]
	refuse := func(err error) { unsettled.CompareAndSwap(nil, &err) }
	m, err := e.consume(ctx, o, rawName(c, l), l.stream(), l.reshape, func(ctx context.Context, t *tracker) (func(), error) {
		var checkpoint func(context.Context, jetstream.Msg, string) error
		if c == CheckpointingDoubleAck {
			kv, err := e.subJS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket: rawCheckpointBucket, Storage: jetstream.FileStorage,
			})
			if err != nil {
				return nil, err
			}
			checkpoint = checkpointer(kv, "r"+strconv.Itoa(e.runs)+".")
		}
		cons, err := e.subJS.CreateOrUpdateConsumer(ctx, l.stream(), jetstream.ConsumerConfig{
			Durable:   "raw-" + strconv.Itoa(e.runs),
			AckPolicy: jetstream.AckExplicitPolicy,
		})
		if err != nil {
			return nil, err
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			id := m.Headers().Get(idHeader)
			var ev event.Event
			if c.validates() {
				start := time.Now()
				var err error
				ev, err = events.Decode(m.Headers(), m.Data())
				if err == nil {
					err = events.Validate(ev)
				}
				if err != nil {
					// Every event was validated when it was made, so this
					// is the bench's own fault: the event never settles,
					// and the path's timeout says why.
					refuse(fmt.Errorf("event %s did not validate: %w", id, err))
					return
				}
				t.handleChecked(id, start)
			} else {
				t.handle(id)
			}
			if checkpoint != nil {
				if err := checkpoint(ctx, m, ev.Subject()); err != nil {
					refuse(fmt.Errorf("event %s: %w", id, err))
					return
				}
			}
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
	if why := unsettled.Load(); err != nil && why != nil {
		return Measure{}, fmt.Errorf("%w; the first event that did not settle: %w", err, *why)
	}
	return m, err
}

// checkpointer writes a message's stream sequence as the checkpoint of
// key, under prefix in kv, compare-and-set (casWriter): a lost race is an
// error, as the runtime's is. It must be called from one goroutine at a
// time, as a Consume callback is.
func checkpointer(kv jetstream.KeyValue, prefix string) func(context.Context, jetstream.Msg, string) error {
	write := casWriter(kv)
	return func(ctx context.Context, m jetstream.Msg, key string) error {
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("its stream sequence is not in its metadata, so no checkpoint was written: %w", err)
		}
		name := prefix + key
		if err := write(ctx, name, strconv.AppendUint(nil, meta.Sequence.Stream, 10)); err != nil {
			return fmt.Errorf("the checkpoint %s was not written, so the event is not acked: %w", name, err)
		}
		return nil
	}
}

// casWriter writes a value under a name in kv compare-and-set on the
// revision it wrote there last, creating the name on its first write: what
// a nats.go user writes to keep one writer per key. It keeps its revisions
// unlocked, so it must be called from one goroutine at a time.
func casWriter(kv jetstream.KeyValue) func(ctx context.Context, name string, value []byte) error {
	revisions := map[string]uint64{}
	return func(ctx context.Context, name string, value []byte) (err error) {
		var rev uint64
		if last, ok := revisions[name]; ok {
			rev, err = kv.Update(ctx, name, value, last)
		} else {
			rev, err = kv.Create(ctx, name, value)
		}
		if err != nil {
			return err
		}
		revisions[name] = rev
		return nil
	}
}
