package workers

import (
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

type options struct {
	ackWait       time.Duration
	heartbeat     time.Duration
	maxDeliver    int
	concurrency   int
	maxAckPending int
	shutdownGrace time.Duration
	replicas      int
	newBackoff    func() backoff.BackOff
	logger        zerolog.Logger
	registerer    prometheus.Registerer
	now           func() time.Time
}

func defaultOptions() options {
	return options{
		ackWait:       DefaultAckWait,
		maxDeliver:    DefaultMaxDeliver,
		concurrency:   DefaultConcurrency,
		shutdownGrace: DefaultShutdownGrace,
		replicas:      1,
		newBackoff:    DefaultBackoff,
		logger:        zerolog.Nop(),
		registerer:    prometheus.DefaultRegisterer,
		now:           time.Now,
	}
}

// DefaultBackoff is exponential from one second to one minute with 50%
// jitter, so a failing dependency is not hammered in lockstep.
func DefaultBackoff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = time.Second
	b.MaxInterval = time.Minute
	b.RandomizationFactor = 0.5
	b.MaxElapsedTime = 0
	return b
}

// Option tunes a Worker.
type Option func(*options)

// WithAckWait sets how long the server waits for an ack before it
// redelivers. Keep it short: handlers heartbeat, so only a crashed process
// lets it expire, and then redelivery is fast.
func WithAckWait(d time.Duration) Option { return func(o *options) { o.ackWait = d } }

// WithHeartbeat sets how often held messages are marked in progress; the
// default is a third of AckWait.
func WithHeartbeat(d time.Duration) Option { return func(o *options) { o.heartbeat = d } }

// WithMaxDeliver sets how many deliveries a failing event gets before it
// goes to the DLQ.
func WithMaxDeliver(n int) Option { return func(o *options) { o.maxDeliver = n } }

// WithConcurrency sets how many keys are handled at once.
func WithConcurrency(n int) Option { return func(o *options) { o.concurrency = n } }

// WithMaxAckPending bounds the events held unacknowledged at once; the
// default is 16 per unit of concurrency.
func WithMaxAckPending(n int) Option { return func(o *options) { o.maxAckPending = n } }

// WithShutdownGrace sets how long in-flight handlers may run on after the
// worker is told to stop.
func WithShutdownGrace(d time.Duration) Option { return func(o *options) { o.shutdownGrace = d } }

// WithReplicas sets the replica count of the checkpoint bucket and the
// streams the worker ensures (3 on a three-node cluster).
func WithReplicas(n int) Option { return func(o *options) { o.replicas = n } }

// WithBackoff sets the retry delays: the n-th failed delivery waits the n-th
// interval of a fresh policy.
func WithBackoff(newBackoff func() backoff.BackOff) Option {
	return func(o *options) { o.newBackoff = newBackoff }
}

// WithLogger sets the zerolog logger; the default discards.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer sets where metrics are registered; the default is
// prometheus.DefaultRegisterer.
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.registerer = r } }
