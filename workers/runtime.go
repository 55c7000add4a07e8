package workers

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/tracing"
)

// Runtime is the runtime of one worker instance: it runs one Handler over
// the instance's events, read through its durable consumer or straight from
// the stream (ReadMode). Which part of it does what is in docs/design.md.
type Runtime struct {
	*instance
	// exec runs the handler and classifies its result; settler records,
	// acks, supersedes and dead-letters; cps keeps the checkpoints; queue
	// holds every message the worker holds, by key.
	exec    *executor
	settler *settler
	cps     *checkpointStore
	queue   *keyedQueue
	// src is where the events come from (source.go).
	src   source
	store *events.Store
	// jetStreams is the instance's streams on the server, whose
	// STEWARD_EVENTS Ensure binds for the order scan.
	jetStreams *jetStreams
	state      *State

	running  atomic.Bool
	stopping atomic.Bool
	// stop is closed when the worker starts shutting down, so lanes
	// waiting for a retry give their events back at once.
	stop chan struct{}

	// ensured says Ensure has made what the instance needs on the server.
	ensureMu sync.Mutex
	ensured  bool
	storeMu  sync.Mutex
	// consuming is set while Run serves, once its source reads.
	consuming atomic.Bool

	// lastStatus is the status document last written (without its time).
	lastStatus []byte
	// statusNow asks the heartbeats to write the status document at once:
	// a key that was listed as retrying has settled, and status must not
	// go on showing it for up to an interval.
	statusNow chan struct{}
	// forged is what the instance found forged in the bucket
	// (documents.go); ephemeralKey says its document key lives only in
	// this process.
	forged       forgeries
	ephemeralKey bool

	sem chan struct{}
	// runners run lanes and ack confirmations on goroutines kept between
	// them (runners.go).
	runners *runners
	tasks   sync.WaitGroup
}

// held is a message the worker holds: queued behind its key, waiting for a
// retry, or running.
type held struct {
	msg       jetstream.Msg
	event     event.Event
	key       string // the order key, as handlers see it
	lane      string // what orders and checkpoints it (laneOf)
	seq       uint64
	delivered uint64
	received  time.Time
	// attempts counts the handler's failures in this process; panics
	// counts those that were panics (bounded by WithMaxPanics).
	attempts     uint64
	panics       int
	backoff      backoff.BackOff
	retryAt      time.Time
	firstFailure time.Time
	lastError    string
	// handled is the handler's result (applied or refused) once it has
	// run: if recording it fails, a retry records it without running the
	// handler again.
	handled string
	// deadReason, when set, sends the event to the DLQ in its turn.
	deadReason error
	// validated says check has run on the event; invalid, that it failed
	// (its lane, chosen before, is not its own to settle).
	validated, invalid bool
	// deferredSince is when the event was first found waiting behind an
	// earlier event of its key that another process holds.
	deferredSince time.Time
	// rank is the event's place in its key's order under a latest-wins
	// Spec, valid when ranked; rankDone says Rank was asked.
	rank     uint64
	ranked   bool
	rankDone bool
	// checkedAt is one more than the attempt count at which the stream
	// was last asked for a newer event of the key (newerStored).
	checkedAt uint64
	// parked says the event is out of attempts (keyedQueue.maxFailures).
	parked bool
	// unsettled says a newer event superseded it but its outcome or
	// checkpoint could not be written: it is superseded again once its
	// retry time has come, not at once, so an unreachable server is not
	// hammered (lane.supersedesNow).
	unsettled bool
}

// New checks spec and the options and returns a Runtime ready to Run. It
// creates nothing on the server: Run (through Ensure) does.
func New(js jetstream.JetStream, spec Spec, h Handler, opts ...Option) (*Runtime, error) {
	return newRuntime(js, spec, h, defaultOptions(), opts)
}

// newRuntime applies opts over o, checks spec and the options, fills in
// what they leave unset and builds the Runtime: the one place New and
// the replay take their defaults from.
func newRuntime(js jetstream.JetStream, spec Spec, h Handler, o options, opts []Option) (*Runtime, error) {
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkSpec(spec, o); err != nil {
		return nil, err
	}
	if o.heartbeat <= 0 {
		o.heartbeat = o.ackWait / 3
	}
	if o.maxAckPending <= 0 {
		o.maxAckPending = 64 * o.concurrency
	}
	if spec.OutcomeNoun == "" {
		spec.OutcomeNoun = spec.Name
	}
	if spec.OrderKey == nil {
		spec.OrderKey = func(e event.Event) string { return e.Subject() }
	}
	ephemeral := documentKeys(&o, spec.Name+"-"+spec.Instance)
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	onServer := &jetStreams{js: js}
	in := &instance{
		spec: spec, o: o, js: js, streams: onServer,
		log:    o.logger.With().Str("worker", spec.Name).Str("instance", spec.Instance).Logger(),
		m:      newMetrics(o.registerer).forInstance(spec.Name, spec.Instance),
		tracer: tp.Tracer(tracing.Scope),
	}
	in.processSpan, in.supersedeSpan = in.spanOperation("process"), in.spanOperation("supersede")
	w := &Runtime{
		instance:     in,
		jetStreams:   onServer,
		ephemeralKey: ephemeral,
		cps:          newCheckpointStore(spec.Name, spec.Instance),
		sem:          make(chan struct{}, o.concurrency),
		runners:      newRunners(),
		stop:         make(chan struct{}),
		statusNow:    make(chan struct{}, 1),
	}
	w.exec = &executor{handler: h, maxPanics: o.maxPanics, panics: in.m.panics}
	w.settler = &settler{instance: in, cps: w.cps, runners: w.runners}
	w.queue = newKeyedQueue(spec.Rank != nil, o.now, o.newBackoff, &w.stopping, &w.tasks)

	// Nothing is created here: New only checks, so a dry run or a test
	// that builds a runtime and never runs it leaves no server state.
	// Ensure (called by Run) creates what is missing.
	w.state = &State{prefix: events.StatePrefix(spec.Name, spec.Instance), open: w.openStore}
	in.backend = &runtimeBackend{in: in, cps: w.cps, state: w.state}
	w.src = &consumerSource{instance: in, accept: w.accept, runners: w.runners, stopping: &w.stopping, cps: w.cps}
	if o.readMode == ReadStream {
		sr := &streamReader{
			instance: in, accept: w.accept, runners: w.runners,
			scanned: map[string]uint64{}, pending: map[uint64]string{}, wake: make(chan struct{}, 1), save: make(chan struct{}, 1), quiet: make(chan struct{}, 1),
		}
		for _, subj := range spec.Subjects {
			// Every subject is in the cursor from the start, so what
			// is settled can be told for each (Settled).
			sr.scanned[subj] = 0
		}
		w.src = sr
	}
	return w, nil
}

// Ensure makes sure what the instance needs on the server exists: the
// streams and the checkpoint bucket (created when missing, an operator's
// limits left alone) and, unless it reads the stream itself, its durable
// consumer. Run calls it first; call it yourself to prepare an instance
// without running it. It is idempotent.
func (w *Runtime) Ensure(ctx context.Context) error {
	w.ensureMu.Lock()
	defer w.ensureMu.Unlock()
	if w.ensured {
		return nil
	}
	kv, err := ensureBus(ctx, w.js, w.o.replicas)
	if err != nil {
		return err
	}
	stream, err := w.js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamEvents, err)
	}
	if err := w.bindStore(ctx, kv); err != nil {
		return err
	}
	w.jetStreams.events = stream
	if w.ephemeralKey {
		w.log.Warn().Msg("no document key configured: this instance signs what it stores with a key that lives only in this process, so after a restart its checkpoints do not verify and each key's events are decided again (give it credentials from steward creds issue, which make one)")
	}
	if err := w.src.ensure(ctx, stream, w.store); err != nil {
		return err
	}
	w.ensured = true
	return nil
}

func checkSpec(spec Spec, o options) error {
	if err := events.CheckKey(spec.Name); err != nil {
		return fmt.Errorf("%w: worker name: %v", ErrInvalidSpec, err)
	}
	if err := events.CheckKey(spec.Instance); err != nil {
		return fmt.Errorf("%w: worker %s instance: %v", ErrInvalidSpec, spec.Name, err)
	}
	if spec.OutcomeNoun != "" && events.CheckKey(spec.OutcomeNoun) != nil {
		return fmt.Errorf("%w: worker %s outcome noun %q is not a key", ErrInvalidSpec, spec.Name, spec.OutcomeNoun)
	}
	if len(spec.Subjects) == 0 {
		return fmt.Errorf("%w: worker %s has no subjects to consume", ErrInvalidSpec, spec.Name)
	}
	if len(spec.Types) == 0 {
		return fmt.Errorf("%w: worker %s has no event types to handle", ErrInvalidSpec, spec.Name)
	}
	if o.ackWait < 100*time.Millisecond || o.maxDeliver < 1 || o.concurrency < 1 || o.maxPanics < 1 {
		return fmt.Errorf("%w: worker %s: ack wait %v, max deliver %d, concurrency %d and max panics %d must be at least 100ms, 1, 1 and 1",
			ErrInvalidSpec, spec.Name, o.ackWait, o.maxDeliver, o.concurrency, o.maxPanics)
	}
	return nil
}

// Spec returns what the worker consumes.
func (w *Runtime) Spec() Spec { return w.spec }

// ConsumerName is the durable consumer's name, "<name>-<instance>".
func (w *Runtime) ConsumerName() string { return w.consumerName() }

// State is the worker instance's durable state.
func (w *Runtime) State() *State { return w.state }

// Ready reports nil while the worker is consuming and connected.
func (w *Runtime) Ready() error {
	if !w.consuming.Load() || w.stopping.Load() {
		return fmt.Errorf("worker %s is not consuming", w.consumerName())
	}
	if nc := w.js.Conn(); nc != nil && !nc.IsConnected() {
		return fmt.Errorf("worker %s: NATS is %s", w.consumerName(), nc.Status())
	}
	return nil
}

// storeBound says whether the instance's store is bound to the bucket.
func (w *Runtime) storeBound() bool {
	w.storeMu.Lock()
	defer w.storeMu.Unlock()
	return w.store != nil
}

// bindStore makes the instance's store over kv, once.
func (w *Runtime) bindStore(ctx context.Context, kv jetstream.KeyValue) error {
	w.storeMu.Lock()
	defer w.storeMu.Unlock()
	if w.store != nil {
		return nil
	}
	s, err := w.newStore(ctx, kv)
	if err != nil {
		return err
	}
	w.store = s
	w.cps.docs = s
	return nil
}

// openStore is the store, bound to the bucket on first use: a handler's
// State may be read before Run has ensured the bucket.
func (w *Runtime) openStore(ctx context.Context) (*events.Store, error) {
	w.storeMu.Lock()
	s := w.store
	w.storeMu.Unlock()
	if s != nil {
		return s, nil
	}
	kv, err := w.js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint bucket %s: %w (a worker creates it when it runs; steward setup creates it for all)", events.CheckpointBucket, err)
	}
	if err := w.bindStore(ctx, kv); err != nil {
		return nil, err
	}
	return w.openStore(ctx)
}
