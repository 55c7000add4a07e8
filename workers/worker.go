package workers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
)

// Headers a dead letter carries besides the original event's.
const (
	HeaderError     = "Steward-Error"
	HeaderWorker    = "Steward-Worker"
	HeaderStreamSeq = "Steward-Stream-Seq"
	HeaderDelivered = "Steward-Deliveries"
	HeaderSubject   = "Steward-Subject"
)

// Worker runs one Handler over one durable consumer.
type Worker struct {
	js       jetstream.JetStream
	spec     Spec
	handler  Handler
	o        options
	kv       jetstream.KeyValue
	stream   jetstream.Stream
	consumer jetstream.Consumer
	state    *State
	log      zerolog.Logger
	m        *metrics
	labels   prometheus.Labels

	running  atomic.Bool
	stopping atomic.Bool

	mu    sync.Mutex
	lanes map[string]*lane
	held  map[*held]struct{}

	sem   chan struct{}
	tasks sync.WaitGroup
	// handlerCtx outlives the Run context by the shutdown grace, so
	// in-flight handlers finish what they started.
	handlerCtx context.Context
}

// held is a message the worker holds: queued behind its key or running.
type held struct {
	msg       jetstream.Msg
	event     event.Event
	key       string // the order key, as handlers see it
	lane      string // what orders and checkpoints it (laneOf)
	seq       uint64
	delivered uint64
	// deferredSince is when the event was first found waiting behind an
	// earlier event of its key that another process holds.
	deferredSince time.Time
}

// lane is the queue of one order key. Events of a key run one at a time in
// stream order; after a retry is scheduled, or when an earlier event of the
// key is still held elsewhere (by a process that died holding it), the lane
// waits for that event to come back before it runs anything later.
type lane struct {
	queue     []*held
	running   bool
	waitFor   uint64
	waitUntil time.Time
}

// New checks spec, ensures the streams, the checkpoint bucket and the
// worker's durable consumer (idempotently), and returns a Worker ready to
// Run.
func New(ctx context.Context, js jetstream.JetStream, spec Spec, h Handler, opts ...Option) (*Worker, error) {
	o := defaultOptions()
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
		o.maxAckPending = 16 * o.concurrency
	}
	if spec.OutcomeNoun == "" {
		spec.OutcomeNoun = spec.Name
	}
	if spec.OrderKey == nil {
		spec.OrderKey = func(e event.Event) string { return e.Subject() }
	}
	w := &Worker{
		js: js, spec: spec, handler: h, o: o,
		lanes:  map[string]*lane{},
		held:   map[*held]struct{}{},
		sem:    make(chan struct{}, o.concurrency),
		m:      newMetrics(o.registerer),
		labels: prometheus.Labels{"worker": spec.Name, "instance": spec.Instance},
	}
	w.log = o.logger.With().Str("worker", spec.Name).Str("instance", spec.Instance).Logger()

	sc := publisher.DefaultStreamConfig()
	sc.Replicas = o.replicas
	if err := publisher.EnsureStreams(ctx, js, sc); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      CheckpointBucket,
		Description: "Steward workers' checkpoints and state",
		Storage:     jetstream.FileStorage,
		Replicas:    max(o.replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("ensure KV bucket %s: %w", CheckpointBucket, err)
	}
	w.kv = kv
	w.state = &State{kv: kv, prefix: "st." + spec.Name + "." + spec.Instance + "."}
	if w.stream, err = js.Stream(ctx, publisher.StreamEvents); err != nil {
		return nil, fmt.Errorf("stream %s: %w", publisher.StreamEvents, err)
	}
	w.consumer, err = js.CreateOrUpdateConsumer(ctx, publisher.StreamEvents, jetstream.ConsumerConfig{
		Durable:        w.consumerName(),
		Description:    "Steward " + spec.Name + " worker for " + spec.Instance,
		FilterSubjects: spec.Subjects,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        o.ackWait,
		MaxDeliver:     o.maxDeliver,
		MaxAckPending:  o.maxAckPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", w.consumerName(), err)
	}
	return w, nil
}

// ErrInvalidSpec marks a Spec or options New refuses: no retry fixes it.
var ErrInvalidSpec = errors.New("invalid worker spec")

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
	if o.ackWait < 100*time.Millisecond || o.maxDeliver < 1 || o.concurrency < 1 {
		return fmt.Errorf("%w: worker %s: ack wait %v, max deliver %d and concurrency %d must be at least 100ms, 1 and 1", ErrInvalidSpec, spec.Name, o.ackWait, o.maxDeliver, o.concurrency)
	}
	return nil
}

func (w *Worker) consumerName() string { return w.spec.Name + "-" + w.spec.Instance }

func (w *Worker) outcomeSubject() string {
	return events.OutcomesPrefix + "." + w.spec.Name + "." + w.spec.Instance
}

func (w *Worker) dlqSubject() string {
	return events.DLQPrefix + "." + w.spec.Name + "." + w.spec.Instance
}

func (w *Worker) now() time.Time { return w.o.now() }

// Spec returns what the worker consumes.
func (w *Worker) Spec() Spec { return w.spec }

// ConsumerName is the durable consumer's name, "<name>-<instance>".
func (w *Worker) ConsumerName() string { return w.consumerName() }

// State is the worker instance's durable state.
func (w *Worker) State() *State { return w.state }

// Ready reports nil while the worker is consuming and connected.
func (w *Worker) Ready() error {
	if !w.running.Load() || w.stopping.Load() {
		return fmt.Errorf("worker %s is not consuming", w.consumerName())
	}
	if nc := w.js.Conn(); nc != nil && !nc.IsConnected() {
		return fmt.Errorf("worker %s: NATS is %s", w.consumerName(), nc.Status())
	}
	return nil
}

// Run consumes until ctx is done, then shuts down: it stops pulling, naks
// what has not started so it is redelivered at once, and lets running
// handlers finish within the shutdown grace before cancelling them.
func (w *Worker) Run(ctx context.Context) error {
	if !w.running.CompareAndSwap(false, true) {
		return fmt.Errorf("worker %s is already running", w.consumerName())
	}
	defer w.running.Store(false)
	w.stopping.Store(false)
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	w.handlerCtx = hctx

	it, err := w.consumer.Messages(jetstream.PullMaxMessages(max(2*w.o.concurrency, 16)))
	if err != nil {
		return fmt.Errorf("consume %s: %w", w.consumerName(), err)
	}
	readerDone := make(chan struct{})
	var readErr error
	go func() {
		defer close(readerDone)
		for {
			msg, err := it.Next()
			switch {
			case errors.Is(err, jetstream.ErrMsgIteratorClosed):
				return
			case errors.Is(err, nats.ErrConnectionClosed):
				readErr = fmt.Errorf("consumer %s stopped: %w", w.consumerName(), err)
				return
			case err != nil:
				// Missed heartbeats and reconnects surface here; the
				// iterator recovers by itself, so note it and go on.
				w.log.Debug().Err(err).Msg("pull interrupted")
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			w.accept(msg)
		}
	}()
	hbDone := make(chan struct{})
	hbStop := make(chan struct{})
	go w.heartbeats(hbStop, hbDone)
	w.log.Info().Str("consumer", w.consumerName()).Strs("subjects", w.spec.Subjects).Msg("worker consuming")

	select {
	case <-ctx.Done():
	case <-readerDone:
		// The connection closed for good: stop as if told to, and say so.
	}
	w.stopping.Store(true)
	it.Drain()
	<-readerDone
	w.releaseQueued()

	finished := make(chan struct{})
	go func() { w.tasks.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(w.o.shutdownGrace):
		w.log.Warn().Dur("grace", w.o.shutdownGrace).Msg("handlers still running after the shutdown grace; cancelling them")
		cancelHandlers()
		<-finished
	}
	close(hbStop)
	<-hbDone
	if readErr != nil {
		w.log.Error().Err(readErr).Msg("worker stopped")
		return readErr
	}
	w.log.Info().Msg("worker stopped")
	return nil
}

// accept takes a message from the consumer and queues it behind its key.
func (w *Worker) accept(msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		w.log.Error().Err(err).Msg("message without JetStream metadata")
		return
	}
	h := &held{msg: msg, seq: meta.Sequence.Stream, delivered: meta.NumDelivered}
	if w.stopping.Load() {
		w.release(h)
		return
	}
	e, err := events.Decode(msg.Headers(), msg.Data())
	if err == nil {
		err = w.check(msg.Subject(), e)
	}
	if err != nil {
		// Nothing a retry can fix: straight to the DLQ, off the key lanes
		// (an invalid event has no trustworthy key).
		h.key = "invalid"
		w.hold(h)
		w.tasks.Add(1)
		go func() {
			defer w.tasks.Done()
			defer w.unhold(h)
			w.deadLetter(h, Permanent(err), w.log.With().Uint64("seq", h.seq).Logger())
		}()
		return
	}
	h.event, h.key = e, w.spec.OrderKey(e)
	h.lane = laneOf(e.Type(), h.key)

	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.lanes[h.lane]
	if l == nil {
		l = &lane{}
		w.lanes[h.lane] = l
	}
	if i := slices.IndexFunc(l.queue, func(q *held) bool { return q.seq == h.seq }); i >= 0 {
		// Redelivered while still queued here: keep the newer delivery.
		delete(w.held, l.queue[i])
		l.queue[i] = h
		w.held[h] = struct{}{}
		return
	}
	for q := range w.held {
		if q.seq == h.seq {
			// Redelivered while its handler runs: the running one decides.
			return
		}
	}
	w.held[h] = struct{}{}
	w.m.inFlight.With(w.labels).Inc()
	l.insert(h)
	if l.waitFor == h.seq {
		l.waitFor = 0
	}
	w.startLane(h.lane, l)
}

// insert queues h in stream order.
func (l *lane) insert(h *held) {
	i, _ := slices.BinarySearchFunc(l.queue, h.seq, func(q *held, seq uint64) int { return cmp.Compare(q.seq, seq) })
	l.queue = slices.Insert(l.queue, i, h)
}

// startLane runs a lane that has work and no runner. Callers hold w.mu.
func (w *Worker) startLane(key string, l *lane) {
	if l.running || len(l.queue) == 0 || w.stopping.Load() {
		return
	}
	l.running = true
	w.tasks.Add(1)
	go w.runLane(key, l)
}

func (w *Worker) runLane(key string, l *lane) {
	defer w.tasks.Done()
	for {
		w.mu.Lock()
		if w.stopping.Load() || len(l.queue) == 0 || (l.waitFor != 0 && l.queue[0].seq > l.waitFor) {
			l.running = false
			if len(l.queue) == 0 && l.waitFor == 0 {
				delete(w.lanes, key)
			}
			w.mu.Unlock()
			return
		}
		h := l.queue[0]
		l.queue = l.queue[1:]
		if l.waitFor != 0 && h.seq >= l.waitFor {
			// The retried event is back (it may have come back before
			// the wait was even set): later events may follow it.
			l.waitFor = 0
		}
		w.mu.Unlock()

		select {
		case w.sem <- struct{}{}:
		case <-w.handlerCtx.Done():
			w.release(h)
			w.unhold(h)
			continue
		}
		retried, behind := w.process(h)
		<-w.sem
		if behind != 0 {
			// Still held, and heartbeated, so waiting costs no delivery:
			// back in the queue until the earlier event comes back or
			// the wait runs out and the order is checked again.
			w.mu.Lock()
			l.insert(h)
			if l.queue[0] == h {
				l.waitFor = behind
				l.waitUntil = w.now().Add(w.o.ackWait)
			}
			w.mu.Unlock()
			continue
		}
		w.unhold(h)
		if retried {
			w.mu.Lock()
			l.waitFor = h.seq
			// Another process of the same consumer may get the
			// redelivery; then this one stops waiting after AckWait.
			l.waitUntil = w.now().Add(w.retryDelay(h.delivered) + w.o.ackWait)
			w.mu.Unlock()
		}
	}
}

func (w *Worker) hold(h *held) {
	w.mu.Lock()
	w.held[h] = struct{}{}
	w.mu.Unlock()
	w.m.inFlight.With(w.labels).Inc()
}

func (w *Worker) unhold(h *held) {
	w.mu.Lock()
	_, ok := w.held[h]
	delete(w.held, h)
	w.mu.Unlock()
	if ok {
		w.m.inFlight.With(w.labels).Dec()
	}
}

// releaseQueued naks every queued event that has not started, so that a
// stopping worker hands them back for immediate redelivery.
func (w *Worker) releaseQueued() {
	w.mu.Lock()
	var queued []*held
	for key, l := range w.lanes {
		queued = append(queued, l.queue...)
		l.queue = nil
		if !l.running {
			delete(w.lanes, key)
		}
	}
	w.mu.Unlock()
	for _, h := range queued {
		w.release(h)
		w.unhold(h)
	}
}

func (w *Worker) release(h *held) {
	if err := h.msg.Nak(); err != nil {
		w.log.Debug().Err(err).Uint64("seq", h.seq).Msg("nak at shutdown failed; the event is redelivered after AckWait")
	}
	w.m.events.With(w.withResult(resultReleased)).Inc()
}

// heartbeats marks every held message in progress, so a short AckWait and a
// long handler (or a long queue behind one key) live together, and lets
// lanes stop waiting for a retry another process took.
func (w *Worker) heartbeats(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(w.o.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		w.mu.Lock()
		msgs := make([]jetstream.Msg, 0, len(w.held))
		for h := range w.held {
			msgs = append(msgs, h.msg)
		}
		now := w.now()
		for key, l := range w.lanes {
			if l.waitFor != 0 && now.After(l.waitUntil) {
				l.waitFor = 0
				w.startLane(key, l)
			}
		}
		w.mu.Unlock()
		for _, m := range msgs {
			_ = m.InProgress()
		}
	}
}

// check is the runtime's validation: the shared event validation, a type
// this worker handles, and for keyed subjects a subject that names the
// event's own key.
func (w *Worker) check(subject string, e event.Event) error {
	if err := events.Validate(e); err != nil {
		return err
	}
	if !slices.Contains(w.spec.Types, e.Type()) {
		return fmt.Errorf("%w: worker %s does not handle type %q", events.ErrInvalid, w.spec.Name, e.Type())
	}
	k, _ := events.Lookup(e.Type())
	if k.KeyInSubject && !strings.HasSuffix(subject, "."+e.Subject()) {
		return fmt.Errorf("%w: NATS subject %q does not end in the event's key %q", events.ErrInvalid, subject, e.Subject())
	}
	return nil
}

func (w *Worker) withResult(result string) prometheus.Labels {
	return prometheus.Labels{"worker": w.spec.Name, "instance": w.spec.Instance, "result": result}
}

// process runs one delivery to its end and reports whether a retry was
// scheduled, or the sequence of an earlier event of the same key that must
// settle first (the delivery is then still held, neither acked nor naked).
func (w *Worker) process(h *held) (retried bool, behind uint64) {
	ctx := w.handlerCtx
	start := w.now()
	log := w.log.With().
		Str("key", h.key).Str("event_id", h.event.ID()).Str("type", h.event.Type()).
		Uint64("seq", h.seq).Uint64("attempt", h.delivered).Logger()
	result, behind, err := w.apply(ctx, h, log)
	elapsed := w.now().Sub(start)
	w.m.duration.With(w.labels).Observe(elapsed.Seconds())

	switch {
	case result != "":
	case ctx.Err() != nil:
		w.release(h)
		result = resultReleased
	case IsPermanent(err):
		result = w.deadLetter(h, err, log)
	case h.delivered >= uint64(w.o.maxDeliver):
		result = w.deadLetter(h, Permanent(fmt.Errorf("failed %d deliveries, the last with: %w", h.delivered, err)), log)
	default:
		result = w.retry(h, err, log)
	}
	ev := log.Info()
	if err != nil {
		ev = log.Warn().Str("error", oneLine(err.Error()))
	}
	if behind != 0 {
		ev = ev.Uint64("behind", behind)
	}
	ev.Str("outcome", result).Dur("duration", elapsed).Msg("delivery handled")
	return result == resultRetried, behind
}

// apply checks the checkpoint and the order, runs the handler and records
// success. It returns a result when the delivery is settled or deferred
// (with the sequence it waits behind), or the handler's error.
func (w *Worker) apply(ctx context.Context, h *held, log zerolog.Logger) (string, uint64, error) {
	cp, rev, err := w.getCheckpoint(ctx, h.lane)
	if err != nil {
		return "", 0, err
	}
	if h.seq <= cp.Applied {
		// A late redelivery of something older than what was applied:
		// applying it would roll the key back.
		w.ack(ctx, h, log)
		w.m.events.With(w.withResult(resultSkipped)).Inc()
		log.Info().Uint64("applied", cp.Applied).Msg("event is older than the last applied for its key; skipped")
		return resultSkipped, 0, nil
	}
	behind, err := w.earlierUnsettled(ctx, h, cp.Applied)
	if err != nil {
		return "", 0, err
	}
	if behind != 0 {
		now := w.now()
		if h.deferredSince.IsZero() {
			h.deferredSince = now
		}
		if waited := now.Sub(h.deferredSince); waited < w.orderWait() {
			return resultDeferred, behind, nil
		}
		log.Warn().Uint64("behind", behind).Dur("waited", now.Sub(h.deferredSince)).
			Msg("an earlier event of this key has not settled in time; handling this one without it, and the earlier one is skipped if it comes back")
	}
	d := &Delivery{Event: h.event, Key: h.key, Sequence: h.seq, Attempt: h.delivered, Log: log, w: w, lane: h.lane, cp: cp, cpRev: rev}
	result := resultApplied
	if err := w.call(ctx, d); IsRefused(err) {
		// A refusal settles the event as an application does: its
		// outcome is out, and a redelivery would be refused again.
		result = resultRefused
		log.Info().Str("reason", oneLine(err.Error())).Msg("event refused by the worker's rules")
	} else if err != nil {
		return "", 0, err
	}
	if err := w.markApplied(ctx, h, d.cp, d.cpRev); err != nil {
		return "", 0, err
	}
	w.ack(ctx, h, log)
	w.m.events.With(w.withResult(result)).Inc()
	return result, 0, nil
}

// maxOrderScan bounds how many earlier events on the subject are read to
// find one of the same key; past it the checkpoint alone keeps the key
// from rolling back.
const maxOrderScan = 64

// earlierUnsettled returns the sequence of an event of the same kind and
// order key, on the same subject, stored after the last applied one and
// before h: an event another process took and has not settled (it died
// holding it, or is still working on it). Handling h first would break the
// key's stream order, so h waits for it. Zero when there is none.
func (w *Worker) earlierUnsettled(ctx context.Context, h *held, applied uint64) (uint64, error) {
	seq := applied + 1
	for range maxOrderScan {
		if seq >= h.seq {
			return 0, nil
		}
		m, err := w.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(h.msg.Subject()))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("check the order of %s before sequence %d: %w", h.key, h.seq, err)
		}
		if m.Sequence >= h.seq {
			return 0, nil
		}
		// Invalid events and events of other keys never block this one:
		// they are dead-lettered or ordered on their own.
		if e, err := events.Decode(m.Header, m.Data); err == nil && w.check(m.Subject, e) == nil &&
			laneOf(e.Type(), w.spec.OrderKey(e)) == h.lane {
			return m.Sequence, nil
		}
		seq = m.Sequence + 1
	}
	return 0, nil
}

// orderWait is how long an event waits behind an earlier one of its key
// that another process holds: long enough for that process's deliveries
// to run out, after which it would never come back.
func (w *Worker) orderWait() time.Duration {
	return w.o.ackWait*time.Duration(w.o.maxDeliver) + time.Minute
}

// call runs the handler and turns a panic into an ordinary failure.
func (w *Worker) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			w.m.panics.With(w.labels).Inc()
			d.Log.Error().Str("panic", oneLine(fmt.Sprint(r))).Str("stack", string(debug.Stack())).Msg("handler panicked")
			err = fmt.Errorf("handler panicked on %s (event %s): %v", d.Key, d.Event.ID(), r)
		}
	}()
	return w.handler.Handle(ctx, d)
}

// markApplied moves the key's checkpoint to this event (applied, or
// settled in the DLQ), unless another process already moved it further, so
// later events of the key never wait for it. cp and rev are what the caller
// last read or wrote (zero: read it first).
func (w *Worker) markApplied(ctx context.Context, h *held, cp checkpoint, rev uint64) error {
	var err error
	if rev == 0 {
		if cp, rev, err = w.getCheckpoint(ctx, h.lane); err != nil {
			return err
		}
	}
	for range 5 {
		if cp.Applied >= h.seq {
			return nil
		}
		next := checkpoint{Applied: h.seq, EventID: h.event.ID()}
		_, err := w.putCheckpoint(ctx, h.lane, next, rev)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), err)
		}
		if cp, rev, err = w.getCheckpoint(ctx, h.lane); err != nil {
			return err
		}
	}
	return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), ErrConflict)
}

func (w *Worker) ack(ctx context.Context, h *held, log zerolog.Logger) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := h.msg.DoubleAck(actx); err != nil {
		// The checkpoint already says applied: a redelivery is skipped.
		log.Warn().Err(err).Msg("ack not confirmed; a redelivery will be skipped by the checkpoint")
	}
}

func (w *Worker) retryDelay(delivered uint64) time.Duration {
	b := w.o.newBackoff()
	d := b.NextBackOff()
	for i := uint64(1); i < delivered && d != backoff.Stop; i++ {
		d = b.NextBackOff()
	}
	if d == backoff.Stop || d < 0 {
		return 0
	}
	return d
}

func (w *Worker) retry(h *held, err error, log zerolog.Logger) string {
	delay := w.retryDelay(h.delivered)
	if nakErr := h.msg.NakWithDelay(delay); nakErr != nil {
		log.Warn().Err(nakErr).Msg("nak failed; the event is redelivered after AckWait")
	}
	w.m.events.With(w.withResult(resultRetried)).Inc()
	log.Debug().Dur("delay", delay).Msg("retry scheduled")
	return resultRetried
}

// deadLetter publishes the event with its headers and the reason to the
// DLQ, then terminates it. If the DLQ cannot be written the event is
// retried instead: nothing is dropped silently.
func (w *Worker) deadLetter(h *held, reason error, log zerolog.Logger) string {
	dl := nats.NewMsg(w.dlqSubject())
	for k, v := range h.msg.Headers() {
		dl.Header[k] = append([]string(nil), v...)
	}
	dl.Header.Set(nats.MsgIdHdr, "dlq-"+w.consumerName()+"-"+strconv.FormatUint(h.seq, 10))
	msg := oneLine(reason.Error())
	dl.Header.Set(HeaderError, msg)
	dl.Header.Set(HeaderWorker, w.consumerName())
	dl.Header.Set(HeaderStreamSeq, strconv.FormatUint(h.seq, 10))
	dl.Header.Set(HeaderDelivered, strconv.FormatUint(h.delivered, 10))
	dl.Header.Set(HeaderSubject, h.msg.Subject())
	dl.Data = h.msg.Data()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.handlerCtx), 10*time.Second)
	defer cancel()
	if _, err := w.js.PublishMsg(ctx, dl, jetstream.WithExpectStream(publisher.StreamDLQ)); err != nil {
		log.Error().Err(err).Msg("the DLQ could not be written; retrying the event instead of dropping it")
		return w.retry(h, err, log)
	}
	if h.lane != "" {
		// Settled: later events of its key must not wait for it.
		if err := w.markApplied(ctx, h, checkpoint{}, 0); err != nil {
			log.Error().Err(err).Msg("the checkpoint could not record the dead letter; retrying the event (the DLQ deduplicates it)")
			return w.retry(h, err, log)
		}
	}
	if err := h.msg.TermWithReason(truncate(msg, 256)); err != nil {
		log.Warn().Err(err).Msg("term failed after the event reached the DLQ; a redelivery is deduplicated there")
	}
	w.m.events.With(w.withResult(resultDead)).Inc()
	log.Warn().Str("reason", msg).Msg("event sent to the DLQ")
	return resultDead
}

// oneLine keeps a reason on one header line and within a readable size.
func oneLine(s string) string {
	return truncate(strings.Join(strings.Fields(s), " "), 2000)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
