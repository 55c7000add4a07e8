package workers

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// ensureConsumer creates or updates the worker instance's durable pull
// consumer on STEWARD_EVENTS, filtered on its subjects.
func (w *Worker) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	c, err := w.js.CreateOrUpdateConsumer(ctx, events.StreamEvents, jetstream.ConsumerConfig{
		Durable:        w.consumerName(),
		Description:    "Steward " + w.spec.Name + " worker for " + w.spec.Instance,
		FilterSubjects: w.spec.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        w.o.ackWait,
		// Unlimited: the server never gives up on desired state. The
		// runtime retries failures in process, and bounds only deliveries
		// that never settle (WithMaxDeliver), a crash loop.
		MaxDeliver:    -1,
		MaxAckPending: w.o.maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", w.consumerName(), err)
	}
	return c, nil
}
