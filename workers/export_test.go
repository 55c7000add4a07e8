package workers

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// ReadWithPulls starts w's consumer source reading consumer, with opts
// added to every pull (a short expiry and heartbeat, so that a test
// waits seconds, not nats.go's half-minute), as Run would once Ensure is
// done. It returns what closes when the source stops, and why it did.
func ReadWithPulls(w *Runtime, consumer jetstream.Consumer, opts ...jetstream.PullMessagesOpt) (<-chan struct{}, func() error, error) {
	c := w.src.(*consumerSource)
	c.consumer = pullsWith{Consumer: consumer, opts: opts}
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
