package workers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
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

// consumerSource is the source of a ReadConsumer instance: its durable pull
// consumer, which several processes of the instance share, taken from by
// one runner at a time (taker.go).
type consumerSource struct {
	*instance
	// accept queues a message taken behind its key (Runtime.accept).
	accept   func(jetstream.Msg, *jetstream.MsgMetadata) (run func())
	runners  *runners
	stopping *atomic.Bool
	cps      *checkpointStore
	// lastSeq is the consumer sequence of the last delivery taken: a gap
	// in it means another process (or a lost pull) took events.
	lastSeq uint64
	// stream and consumer are bound by ensure; it and tk by read.
	stream   jetstream.Stream
	consumer jetstream.Consumer
	it       jetstream.MessagesContext
	tk       *taker
}

func (c *consumerSource) ensure(ctx context.Context, stream jetstream.Stream, _ *events.Store) error {
	c.stream = stream
	consumer, err := c.ensureConsumer(ctx)
	if err != nil {
		return err
	}
	c.consumer = consumer
	return nil
}

func (c *consumerSource) read(context.Context) (<-chan struct{}, error) {
	// A pull as large as what the consumer may have outstanding keeps
	// lanes fed in a burst, so runs of a key form and share a checkpoint
	// write (batch.go): a smaller one left them starved, each event of a
	// key on its own. It costs no more memory than holding them does.
	//
	// Missing heartbeats must be reported, not only re-pulled (nats.go's
	// default, set here because the taker rests on it): a pull that
	// reaches the server after the consumer is gone (deleted between two
	// pulls, or an R1 consumer lost with its server) gets no 409, only
	// silence, and the taker then asks whether the consumer still exists.
	it, err := c.consumer.Messages(jetstream.PullMaxMessages(c.o.maxAckPending), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", c.consumerName(), err)
	}
	c.it, c.tk = it, newTaker(c, it)
	c.runners.run(c.tk.take)
	return c.tk.done, nil
}

// take hands a delivery to accept, having noted what its metadata says:
// a gap in the consumer sequence (deliveries went elsewhere: another
// process of this instance, or a pull lost on a reconnect) makes the
// checkpoints cached here stale, since an earlier event of a key may be
// held elsewhere; and the count still pending, which costs no request.
func (c *consumerSource) take(msg jetstream.Msg) (run func()) {
	meta, err := msg.Metadata()
	if err != nil {
		c.log.Error().Err(err).Msg("message without JetStream metadata")
		return nil
	}
	if !c.stopping.Load() {
		if c.lastSeq != 0 && meta.Sequence.Consumer != c.lastSeq+1 {
			c.cps.gap()
		}
		c.lastSeq = meta.Sequence.Consumer
		c.m.pending.Set(float64(meta.NumPending))
	}
	return c.accept(msg, meta)
}

// gone says whether the consumer can no longer be read, asked when its
// heartbeats stopped: the error Run ends with when the connection has
// closed for good or the server says the consumer (or its stream) is not
// there; nil while it is, or while the server cannot say, and nats.go then
// pulls again. A closed connection is checked first because nats.go does
// not always close the iterator on one: a close that lands while the
// subscription is being set up leaves it waiting, heartbeats missed, for
// good.
func (c *consumerSource) gone() error {
	if nc := c.js.Conn(); nc != nil && nc.IsClosed() {
		return nats.ErrConnectionClosed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.consumer.Info(ctx)
	if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	return fmt.Errorf("%w: its pulls went unanswered, and asked for it the server says %v", jetstream.ErrConsumerDeleted, err)
}

func (c *consumerSource) stopErr() error { return c.tk.err }

func (c *consumerSource) drain() { c.it.Drain() }

func (c *consumerSource) finish(context.Context) {}

// complete is false: deliveries of one key may go to another process of
// the instance, or be lost on a reconnect.
func (c *consumerSource) complete() bool { return false }

func (c *consumerSource) ackFloor(ctx context.Context) (uint64, error) {
	info, err := c.consumer.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.AckFloor.Stream, nil
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
func (c *consumerSource) consumerConfig() jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:        c.consumerName(),
		Description:    "Steward " + c.spec.Name + " worker for " + c.spec.Instance,
		FilterSubjects: c.spec.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.o.ackWait,
		// Unlimited: the server never gives up on desired state. The
		// runtime retries failures in process, and bounds only deliveries
		// that never settle (WithMaxDeliver), a crash loop.
		MaxDeliver:    -1,
		MaxAckPending: c.o.maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if hostBound(c.spec) {
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
func (c *consumerSource) ensureConsumer(ctx context.Context) (jetstream.Consumer, error) {
	want := c.consumerConfig()
	have, err := c.js.Consumer(ctx, events.StreamEvents, want.Durable)
	switch {
	case err == nil && sameConsumer(have.CachedInfo().Config, want):
		return c.wrapConsumer(have), nil
	case err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("look up consumer %s on %s: %w", want.Durable, events.StreamEvents, err)
	}
	have, err = c.js.CreateOrUpdateConsumer(ctx, events.StreamEvents, want)
	if err != nil {
		return nil, c.consumerError(ctx, want.Durable, err)
	}
	return c.wrapConsumer(have), nil
}

// consumerError names the limit a refused consumer hit, with the count and
// the setting that raises it.
func (c *consumerSource) consumerError(ctx context.Context, name string, err error) error {
	if errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
		var info *jetstream.StreamInfo
		if c.stream != nil {
			info, _ = c.stream.Info(ctx)
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
// heartbeat. The Messages call of read sets the batch; this adds what makes
// an idle instance cheap for the server.
func (c *consumerSource) wrapConsumer(consumer jetstream.Consumer) jetstream.Consumer {
	if !hostBound(c.spec) {
		return consumer
	}
	return fleetConsumer{Consumer: consumer}
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
