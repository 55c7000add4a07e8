package workers

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// source is where an instance's events come from, as its ReadMode chose:
// its durable consumer (consumerSource) or the stream itself (streamReader).
// Each message a source takes goes to Runtime.accept, which queues it
// behind its key; settling it (ack, nak, term) tells the source. The rest
// of the engine does not know which source feeds it.
type source interface {
	// ensure makes what the source reads through, once the streams and
	// the bucket exist (Runtime.Ensure).
	ensure(ctx context.Context, stream jetstream.Stream, store *events.Store) error
	// read starts taking messages until ctx ends or drain is called; done
	// closes once it has stopped, after which stopErr says why when it
	// was not asked to.
	read(ctx context.Context) (done <-chan struct{}, err error)
	stopErr() error
	drain()
	// finish runs once every handler has finished, at shutdown: what they
	// settled meanwhile is saved.
	finish(ctx context.Context)
	// complete says every event of the instance's subjects comes to this
	// process, in stream order, so none can be held elsewhere and the
	// order scan (order.go) is never needed.
	complete() bool
	// ackFloor is the sequence at or below which every event was settled
	// as the server says, for the order scan when a checkpoint did not
	// verify.
	ackFloor(ctx context.Context) (uint64, error)
}

// streamReader as a source.

func (sr *streamReader) ensure(_ context.Context, stream jetstream.Stream, store *events.Store) error {
	sr.stream, sr.store = stream, store
	return sr.woken()
}

func (sr *streamReader) read(ctx context.Context) (<-chan struct{}, error) {
	done := make(chan struct{})
	sr.err = nil
	go func() {
		defer close(done)
		sr.err = sr.run(ctx)
	}()
	return done, nil
}

func (sr *streamReader) stopErr() error { return sr.err }

// drain is nothing: the reader stops when the Run context ends.
func (sr *streamReader) drain() {}

func (sr *streamReader) finish(ctx context.Context) { sr.saveCursor(context.WithoutCancel(ctx)) }

func (sr *streamReader) complete() bool { return true }

func (sr *streamReader) ackFloor(context.Context) (uint64, error) { return 0, nil }
