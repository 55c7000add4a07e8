package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// The pull of a host-bound instance. An idle instance costs the server one
// waiting pull request, its idle heartbeats and its renewal at expiry; at
// ten thousand instances nats.go's defaults (30s expiry, 15s heartbeat) are
// about 1,300 messages a second of pure bookkeeping. These keep the
// guarantee the heartbeat exists for (a pull request lost without the
// connection noticing, as when the server holding an R1 consumer restarts
// while the client stays connected elsewhere, is detected and re-sent,
// within 2*fleetPullHeartbeat) at about a quarter of that cost: nats.go
// refuses a heartbeat over 30s, and a longer expiry only saves renewals.
const (
	fleetPullExpiry    = 5 * time.Minute
	fleetPullHeartbeat = 30 * time.Second
)

// hostBound says whether spec is an instance that serves one host (a box,
// a hive, a database machine): one of its subjects ends in the instance's
// own token, so the consumer reads that host's events and little else. Such
// consumers are R1 (see ensureConsumer); converge, whose release subject
// is shared by every install, is not host-bound.
func hostBound(spec Spec) bool {
	return slices.ContainsFunc(spec.Subjects, func(s string) bool {
		return strings.HasSuffix(s, "."+spec.Instance)
	})
}

// consumerConfig is the durable consumer of the instance.
//
// A host-bound instance's consumer is R1 and file-stored whatever the
// stream's replicas. Every replicated consumer is its own Raft group, and a
// server carries about two thousand; a fleet of ten thousand R3 consumers
// would be thirty thousand. What R1 gives up is only availability while
// the one server holding it is down, for that host's reads: the events
// stay in the replicated stream, the checkpoints stay in the replicated
// bucket, and on restart the consumer comes back from its own store with
// its ack floor and consumer sequence (file storage: a memory-stored one
// would restart from the stream's first event with a new consumer
// sequence, and storage type cannot be changed in place, so upgrading to
// it would mean a new consumer). Others inherit the stream's replicas (0).
func (w *Runtime) consumerConfig() jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
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
	}
	if hostBound(w.spec) {
		cfg.Replicas = 1
	}
	return cfg
}

// ensureConsumer makes sure the instance's durable pull consumer exists as
// consumerConfig says, and returns it.
//
// It reads the consumer first and writes it only when it is missing or
// differs: a read is answered by the consumer's own server, while a create
// or an update is a proposal the meta leader orders, and a fleet restarting
// at once must not queue ten thousand of them. An existing consumer is
// updated in place under the same name (an upgrade from R3 to R1 keeps its
// ack floor and consumer sequence, so nothing is delivered twice or
// skipped, and the runtime's gap detection keeps a sequence it can trust).
func (w *Runtime) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	want := w.consumerConfig()
	c, err := w.js.Consumer(ctx, events.StreamEvents, want.Durable)
	switch {
	case err == nil && sameConsumer(c.CachedInfo().Config, want):
		return w.wrapConsumer(c), nil
	case err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("look up consumer %s on %s: %w", want.Durable, events.StreamEvents, err)
	}
	c, err = w.js.CreateOrUpdateConsumer(ctx, events.StreamEvents, want)
	if err != nil {
		return nil, w.consumerError(ctx, want.Durable, err)
	}
	return w.wrapConsumer(c), nil
}

// consumerError names the limit a refused consumer hit, with the count and
// the setting that raises it.
func (w *Runtime) consumerError(ctx context.Context, name string, err error) error {
	if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		var info *jetstream.StreamInfo
		if w.stream != nil {
			info, _ = w.stream.Info(ctx)
		}
		if le := events.AsLimitError(events.StreamEvents, err, info); le != nil {
			return fmt.Errorf("create consumer %s: %w", name, le)
		}
	}
	return fmt.Errorf("ensure consumer %s on %s: %w", name, events.StreamEvents, err)
}

// sameConsumer says whether the consumer as the server holds it is the one
// wanted, on the fields Steward sets (the server fills in the others).
func sameConsumer(have, want jetstream.ConsumerConfig) bool {
	filters := have.FilterSubjects
	if len(filters) == 0 && have.FilterSubject != "" {
		filters = []string{have.FilterSubject}
	}
	return have.Description == want.Description &&
		slices.Equal(filters, want.FilterSubjects) &&
		have.AckPolicy == want.AckPolicy && have.AckWait == want.AckWait &&
		have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending &&
		have.DeliverPolicy == want.DeliverPolicy && have.Replicas == want.Replicas &&
		have.MemoryStorage == want.MemoryStorage
}

// wrapConsumer gives a host-bound instance's pulls the fleet's expiry and
// heartbeat. The runtime's Messages call (consume.go) sets the batch; this
// adds what makes an idle instance cheap for the server.
func (w *Runtime) wrapConsumer(c jetstream.Consumer) jetstream.Consumer {
	if !hostBound(w.spec) {
		return c
	}
	return fleetConsumer{Consumer: c}
}

// fleetConsumer is a consumer whose subscriptions pull with the fleet's
// expiry and heartbeat.
type fleetConsumer struct{ jetstream.Consumer }

// Messages is the consumer's Messages with fleetPullExpiry and
// fleetPullHeartbeat added after the caller's options.
func (c fleetConsumer) Messages(opts ...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	opts = append(slices.Clip(opts), jetstream.PullExpiry(fleetPullExpiry), jetstream.PullHeartbeat(fleetPullHeartbeat))
	return c.Consumer.Messages(opts...)
}
