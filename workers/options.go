package workers

import (
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/steward-dev/steward/internal/proof"
)

type options struct {
	ackWait time.Duration
	// heartbeat is how often held messages are marked in progress: a third
	// of ackWait.
	heartbeat   time.Duration
	maxDeliver  int
	concurrency int
	// maxAckPending bounds the events held unacknowledged at once: 64 per
	// unit of concurrency (2,048 at the default). In a burst, that depth
	// is what lets events of one key queue up and share one checkpoint
	// write. A process holds that many events in memory at most (about 2
	// MiB of typical events; 512 MiB if every one were at the 256 KiB data
	// limit), and hands them back when it stops.
	maxAckPending  int
	shutdownGrace  time.Duration
	replicas       int
	maxPanics      int
	statusInterval time.Duration
	onSettled      func(Settlement)
	tracerProvider trace.TracerProvider
	readMode       ReadMode
	resync         time.Duration
	newBackoff     func() backoff.BackOff
	logger         zerolog.Logger
	registerer     prometheus.Registerer
	now            func() time.Time
	// signer and verifier are the instance's document keys (documents.go).
	signer   *proof.Signer
	verifier *proof.Verifier
	domain   string
}

func defaultOptions() options {
	return options{
		ackWait:        DefaultAckWait,
		maxDeliver:     DefaultMaxDeliver,
		maxPanics:      DefaultMaxPanics,
		statusInterval: defaultStatusInterval,
		resync:         defaultResync,
		concurrency:    DefaultConcurrency,
		shutdownGrace:  DefaultShutdownGrace,
		replicas:       1,
		newBackoff:     backoffUpTo(DefaultMaxBackoff),
		logger:         zerolog.Nop(),
		registerer:     prometheus.DefaultRegisterer,
		now:            time.Now,
	}
}

// backoffUpTo is the retry policy with limit as its cap: exponential from
// half a second (or limit, if less) up to limit with 50% jitter, and never
// giving up, so desired state held up by an outage applies once the outage
// ends, and a failing dependency is not hammered in lockstep.
func backoffUpTo(limit time.Duration) func() backoff.BackOff {
	return func() backoff.BackOff {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval = min(500*time.Millisecond, limit)
		b.MaxInterval = limit
		b.RandomizationFactor = 0.5
		b.MaxElapsedTime = 0
		return b
	}
}

// Option tunes a Runtime.
type Option func(*options)

// WithAckWait sets how long the server waits for an ack before it
// redelivers. Keep it short: handlers heartbeat, so only a crashed process
// lets it expire, and then redelivery is fast.
func WithAckWait(d time.Duration) Option { return func(o *options) { o.ackWait = d } }

// WithMaxDeliver bounds deliveries that never settle: an event delivered
// more often than n times (each process that took it stopped before it
// settled it, a crash loop) goes to the DLQ. Failures the handler returns
// do not count: they are retried in process, without a redelivery, for as
// long as they fail.
func WithMaxDeliver(n int) Option { return func(o *options) { o.maxDeliver = n } }

// WithMaxPanics sets how many times a handler may panic on one event
// before the event goes to the DLQ with the panic as its reason.
func WithMaxPanics(n int) Option { return func(o *options) { o.maxPanics = n } }

// WithTracerProvider sets where the runtime's spans go (one per delivery,
// in the trace its event carries); the default is the global provider,
// which internal/tracing sets from the OTEL_* environment.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// WithReadMode sets how the instance reads its events: through its durable
// consumer (ReadConsumer, the default) or straight from the stream
// (ReadStream, for fleets of host-bound instances; see ReadStream).
func WithReadMode(m ReadMode) Option { return func(o *options) { o.readMode = m } }

// WithSettledHook calls fn once the ack of every settled event is
// confirmed (benchmarks and tests measure publish-to-settled with it). fn
// runs on the confirmation's goroutine and must not block.
func WithSettledHook(fn func(Settlement)) Option { return func(o *options) { o.onSettled = fn } }

// WithConcurrency sets how many keys are handled at once.
func WithConcurrency(n int) Option { return func(o *options) { o.concurrency = n } }

// WithShutdownGrace sets how long in-flight handlers may run on after the
// worker is told to stop.
func WithShutdownGrace(d time.Duration) Option { return func(o *options) { o.shutdownGrace = d } }

// WithReplicas sets the replica count of the checkpoint bucket and the
// streams the worker ensures (3 on a three-node cluster).
func WithReplicas(n int) Option { return func(o *options) { o.replicas = n } }

// WithMaxBackoff caps the delay between two attempts of a failing event
// (default DefaultMaxBackoff): each failing event waits exponentially
// longer, from half a second or the cap if less, with 50% jitter, and is
// tried for as long as it fails.
func WithMaxBackoff(limit time.Duration) Option {
	return func(o *options) { o.newBackoff = backoffUpTo(limit) }
}

// WithLogger sets the zerolog logger; the default discards.
func WithLogger(l zerolog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer sets where metrics are registered; the default is
// prometheus.DefaultRegisterer.
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.registerer = r } }

// WithDocumentKeys sets what the instance signs its stored documents with
// and whose documents it believes (docs/design.md §7): signer is the
// instance's document key (its writer name must be "<worker>-<instance>"),
// verifier trusts it and the operator, by pinned keys or by the account
// that certifies them. `steward worker` loads both from the credentials
// and the document key beside them; workertest uses test keys. Without
// this option an instance signs with a key that lives only in its process,
// so what it stored before a restart no longer verifies and each key's
// events are decided again.
func WithDocumentKeys(signer *proof.Signer, verifier *proof.Verifier) Option {
	return func(o *options) { o.signer, o.verifier = signer, verifier }
}

// WithDomain names the JetStream domain the instance stores in, which
// every document's signature binds (a site's leaf node, docs/design.md §8).
func WithDomain(domain string) Option { return func(o *options) { o.domain = domain } }
