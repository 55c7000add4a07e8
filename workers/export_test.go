package workers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReadWithPulls starts w's consumer source reading consumer, with opts
// added to every pull (a short expiry and heartbeat, so that a test
// waits seconds, not nats.go's half-minute), as Run would once Ensure is
// done. It returns what closes when the source stops, and why it did.
func ReadWithPulls(w *Runtime, consumer jetstream.Consumer, opts ...jetstream.PullMessagesOpt) (<-chan struct{}, func() error, error) {
	return readFrom(w, pullsWith{Consumer: consumer, opts: opts})
}

// ReadMissingItsClose is ReadWithPulls, pulling with heartbeat, over an
// iterator that does not close when its connection does: it reports
// missed heartbeats instead, every two heartbeats, until it is stopped.
// That is nats.go's iterator when the connection closes while it is
// setting up the subscription (the close can land between the
// subscription and its closed handler), which a test cannot time.
func ReadMissingItsClose(w *Runtime, consumer jetstream.Consumer, heartbeat time.Duration) (<-chan struct{}, func() error, error) {
	return readFrom(w, missingClose{Consumer: consumer, heartbeat: heartbeat})
}

// readFrom starts w's consumer source reading consumer, as Run would once
// Ensure is done.
func readFrom(w *Runtime, consumer jetstream.Consumer) (<-chan struct{}, func() error, error) {
	c := w.src.(*consumerSource)
	c.consumer = consumer
	done, err := c.read(context.Background())
	return done, c.stopErr, err
}

// pullsWith is a consumer whose subscriptions pull with opts after the
// caller's.
type pullsWith struct {
	jetstream.Consumer
	opts []jetstream.PullMessagesOpt
}

func (p pullsWith) Messages(opts ...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	return p.Consumer.Messages(append(opts, p.opts...)...)
}

// missingClose is a consumer whose subscriptions pull with heartbeat and
// whose iterators miss their close.
type missingClose struct {
	jetstream.Consumer
	heartbeat time.Duration
}

func (m missingClose) Messages(opts ...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	it, err := m.Consumer.Messages(append(opts, jetstream.PullHeartbeat(m.heartbeat))...)
	if err != nil {
		return nil, err
	}
	return &closeMissed{MessagesContext: it, heartbeat: m.heartbeat, stopped: make(chan struct{})}, nil
}

// closeMissed is an iterator that, once the real one has closed on its
// own, reports missed heartbeats until it is stopped.
type closeMissed struct {
	jetstream.MessagesContext
	heartbeat time.Duration
	once      sync.Once
	stopped   chan struct{}
}

func (m *closeMissed) Next(opts ...jetstream.NextOpt) (jetstream.Msg, error) {
	msg, err := m.MessagesContext.Next(opts...)
	if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
		return msg, err
	}
	select {
	case <-m.stopped:
		return nil, err
	case <-time.After(2 * m.heartbeat):
		return nil, jetstream.ErrNoHeartbeat
	}
}

func (m *closeMissed) Stop() {
	m.once.Do(func() { close(m.stopped) })
	m.MessagesContext.Stop()
}

// GateRead holds w's source at the start of its read until release is
// called; entered closes once Run has got there, after Ensure. So a test
// can look at a worker whose streams, bucket and consumer exist but which
// reads nothing yet.
func GateRead(w *Runtime) (entered <-chan struct{}, release func()) {
	g := &gatedSource{source: w.src, entered: make(chan struct{}), gate: make(chan struct{})}
	w.src = g
	var once sync.Once
	return g.entered, func() { once.Do(func() { close(g.gate) }) }
}

// gatedSource is a source whose read waits for its gate.
type gatedSource struct {
	source
	entered, gate chan struct{}
}

func (g *gatedSource) read(ctx context.Context) (<-chan struct{}, error) {
	close(g.entered)
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.source.read(ctx)
}
