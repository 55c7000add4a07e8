package workertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
)

// Runner runs events through one handler in memory, with no server, and
// applies the runtime's rules to what the handler returns. Its State and the
// stages saved last across calls, and every event gets the next stream
// sequence, so a test can run a story event by event and look at each step.
//
// What it models, as the runtime does it:
//   - validation: an event that fails events.Validate, or whose type is not
//     in Spec.Types, is dead-lettered without reaching the handler;
//   - results: nil is applied, workers.Refused is settled as refused,
//     workers.Permanent is dead-lettered with its reason, any other error is
//     Retried (the runtime would try it again after a backoff; WithAttempts
//     tries it again at once, up to its count), and a panic
//     is caught and tried again at once, up to workers.DefaultMaxPanics
//     times (WithMaxPanics), then dead-lettered with the runtime's reason;
//   - order: events of one key (and kind) run one at a time in stream order,
//     and those queued behind a Retried event of their key are Waiting;
//   - latest wins: under Spec.Rank, the events given to one call are queued
//     together, as a burst is in the runtime, so an event that a later
//     verified event of its key ranks at or above is Superseded, with the
//     runtime's superseded outcome, and never reaches the handler;
//   - outcomes: the same ids, types, sources and subjects as the runtime's,
//     dead letters in the runtime's format (events.DeadLetter), and State
//     with revisions and events.ErrConflict (workers.NewMemoryState).
//
// What it does not model: crashes and redeliveries (use Redelivered to run
// an event as a redelivery that finds a saved stage), the backoff, the
// stream's dedupe window, checkpoints across processes
// (an event is never skipped as older than one applied), heartbeats,
// shutdown, and events arriving while a lane runs (the runtime supersedes
// only what is queued or stored behind). WithRuntime runs the real runtime
// on an embedded server for that.
type Runner struct {
	t         testing.TB
	spec      workers.Spec
	h         workers.Handler
	log       zerolog.Logger
	maxPanics int
	attempts  int

	mu    sync.Mutex
	seq   uint64
	state *workers.State
}

// NewRunner returns a Runner of h for a worker of spec. WithLogger,
// WithMaxPanics and WithAttempts apply; WithRuntime is for Replay and ReplayFile.
func NewRunner(t testing.TB, spec workers.Spec, h workers.Handler, opts ...Option) *Runner {
	t.Helper()
	c := newConfig(opts)
	if c.runtime {
		t.Fatalf("workertest.NewRunner runs in memory; WithRuntime is an option of Replay and ReplayFile")
	}
	return newRunner(t, spec, h, c)
}

func newRunner(t testing.TB, spec workers.Spec, h workers.Handler, c config) *Runner {
	if spec.OutcomeNoun == "" {
		spec.OutcomeNoun = spec.Name
	}
	if spec.OrderKey == nil {
		spec.OrderKey = func(e event.Event) string { return e.Subject() }
	}
	return &Runner{t: t, spec: spec, h: h, log: c.log, maxPanics: c.maxPanics, attempts: c.attempts, state: workers.NewMemoryState()}
}

// State is the worker instance's state, kept in memory across calls. A test
// may seed it before the first event (the installed version, a floor).
func (r *Runner) State() *workers.State { return r.state }

// Work runs one event through the handler and returns what it did.
func (r *Runner) Work(e event.Event, opts ...WorkOption) *Result {
	r.t.Helper()
	return r.run([]event.Event{e}, opts)
}

// WorkData builds an event of type typ for key with data, as a publisher
// would (events.New), and runs it.
func (r *Runner) WorkData(typ, key string, data any, opts ...WorkOption) *Result {
	r.t.Helper()
	e, err := events.New(typ, key, data)
	if err != nil {
		r.t.Fatalf("event %s for %s: %v", typ, key, err)
	}
	return r.Work(e, opts...)
}

// WorkAll runs a stream of events queued together, in order.
func (r *Runner) WorkAll(list []event.Event, opts ...WorkOption) *Result {
	r.t.Helper()
	return r.run(list, opts)
}

// WorkFile runs a recorded stream, CloudEvents in the JSON format one per
// line as `steward export` writes them, queued together.
func (r *Runner) WorkFile(path string, opts ...WorkOption) *Result {
	r.t.Helper()
	return r.run(readFile(r.t, path), opts)
}

// Work runs one event through h in memory, on a fresh Runner: the
// counterpart of rivertest's Worker.Work.
func Work(t testing.TB, spec workers.Spec, h workers.Handler, e event.Event, opts ...WorkOption) *Result {
	t.Helper()
	return NewRunner(t, spec, h).Work(e, opts...)
}

// WorkOption changes how one call of a Runner delivers its events.
type WorkOption func(*work)

type work struct {
	stage    json.RawMessage
	attempt  uint64
	saveErr  error
	emitErrs map[string]error
}

// Redelivered delivers the event again, as after a crash: Attempt is 2 and
// LoadStage finds stage, as an earlier delivery of the same event saved it.
func Redelivered(stage any) WorkOption {
	return func(w *work) {
		raw, err := json.Marshal(stage)
		if err != nil {
			panic(fmt.Sprintf("workertest.Redelivered: the stage does not encode: %v", err))
		}
		w.stage, w.attempt = raw, 2
	}
}

// SaveStageFails makes every SaveStage fail with err, as when the
// checkpoint bucket is down or another process moved the key on (wrap
// events.ErrConflict for that).
func SaveStageFails(err error) WorkOption { return func(w *work) { w.saveErr = err } }

// EmitFails makes emitting the outcome named outcome fail with err, as when
// the outcome stream cannot be written.
func EmitFails(outcome string, err error) WorkOption {
	return func(w *work) {
		if w.emitErrs == nil {
			w.emitErrs = map[string]error{}
		}
		w.emitErrs[outcome] = err
	}
}

// queued is one event of a run with what is known of it.
type queued struct {
	e      event.Event
	seq    uint64
	key    string
	lane   string
	bad    error
	rank   uint64
	ranked bool
}

func (r *Runner) run(list []event.Event, opts []WorkOption) *Result {
	r.t.Helper()
	var wo work
	for _, o := range opts {
		o(&wo)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx := context.Background()
	res := &Result{t: r.t}
	b := &memBackend{res: res, state: r.state, saveErr: wo.saveErr, emitErrs: wo.emitErrs}

	q := make([]*queued, len(list))
	for i, e := range list {
		r.seq++
		prepare(&e)
		it := &queued{e: e, seq: r.seq}
		it.bad = r.check(e)
		if it.bad == nil {
			it.key = r.spec.OrderKey(e)
			it.lane = e.Type() + "\x00" + it.key
		}
		q[i] = it
	}
	if r.spec.Rank != nil {
		for _, it := range q {
			if it.bad == nil {
				rank, err := r.spec.Rank(ctx, r.delivery(it, b, 1, nil))
				it.rank, it.ranked = rank, err == nil
			}
		}
	}
	blocked := map[string]bool{}
	for i, it := range q {
		s := Settled{Sequence: it.seq, ID: it.e.ID(), Type: it.e.Type(), Key: it.key}
		var w *queued
		if it.bad == nil && !blocked[it.lane] {
			w = r.supersededBy(q[i+1:], it)
		}
		switch {
		case it.bad != nil:
			// The runtime's validation: straight to the DLQ.
			s.Verdict, s.Err = DeadLettered, workers.Permanent(it.bad)
			res.DeadLetters = append(res.DeadLetters, r.deadLetter(it, s.Err, 1))
		case blocked[it.lane]:
			s.Verdict = Waiting
		case w != nil:
			s.Verdict = Superseded
			d := r.delivery(it, b, 1, nil)
			// The runtime logs a superseded outcome it cannot publish
			// and settles all the same: the newer event carries the key.
			_ = d.Emit(ctx, workers.OutcomeSuperseded, workers.Superseded{
				Key: it.key, EventID: it.e.ID(), Sequence: it.seq,
				SupersededBy: w.e.ID(), SupersededBySequence: w.seq,
				Reason: "superseded by " + w.e.ID(),
			})
		default:
			attempt := max(wo.attempt, 1)
			s.Verdict, s.Err, s.Attempts = r.handle(ctx, it, b, attempt, wo.stage)
			switch s.Verdict {
			case Retried:
				blocked[it.lane] = true
			case DeadLettered:
				res.DeadLetters = append(res.DeadLetters, r.deadLetter(it, s.Err, attempt))
			}
		}
		res.Events = append(res.Events, s)
	}
	docs, err := r.state.Documents(ctx)
	if err != nil {
		r.t.Fatalf("state: %v", err)
	}
	res.State = docs
	return res
}

// supersededBy is the lane's rule (workers' lane.superseded): the newest
// later event of the key whose verified rank is at least it's.
func (r *Runner) supersededBy(later []*queued, it *queued) *queued {
	if r.spec.Rank == nil || !it.ranked {
		return nil
	}
	var winner *queued
	for _, l := range later {
		if l.bad == nil && l.lane == it.lane && l.ranked && l.rank >= it.rank && (winner == nil || l.rank >= winner.rank) {
			winner = l
		}
	}
	return winner
}

// handle runs the handler on one event until it settles or would be
// retried, trying a panic again at once as the runtime does, and a failure
// as often as WithAttempts allows.
func (r *Runner) handle(ctx context.Context, it *queued, b *memBackend, attempt uint64, stage json.RawMessage) (Verdict, error, int) {
	for panics, failures := 0, 0; ; {
		tries := panics + failures
		d := r.delivery(it, b, attempt+uint64(tries), stage)
		err := call(ctx, r.h, d)
		var p *panicked
		switch {
		case err == nil:
			return Applied, nil, tries + 1
		case workers.IsRefused(err):
			return Refused, err, tries + 1
		case workers.IsPermanent(err):
			return DeadLettered, err, tries + 1
		case errors.As(err, &p):
			if panics++; panics >= r.maxPanics {
				return DeadLettered, workers.Permanent(fmt.Errorf("the handler panicked %d times, the last with: %w", panics, err)), tries + 1
			}
		default:
			if failures++; failures >= r.attempts {
				return Retried, err, tries + 1
			}
		}
		// The next attempt finds what the failed one saved.
		stage = b.lastStage(it.seq, stage)
	}
}

func (r *Runner) delivery(it *queued, b *memBackend, attempt uint64, stage json.RawMessage) *workers.Delivery {
	d := workers.NewDelivery(r.spec, it.e, it.seq, attempt, stage, b)
	d.Log = r.log.With().Str("worker", r.spec.Name).Str("instance", r.spec.Instance).
		Str("key", d.Key).Str("event_id", it.e.ID()).Str("type", it.e.Type()).
		Uint64("seq", it.seq).Uint64("attempt", attempt).Logger()
	return d
}

// check is the runtime's validation of an event it consumes.
func (r *Runner) check(e event.Event) error {
	if err := events.Validate(e); err != nil {
		return err
	}
	if !slices.Contains(r.spec.Types, e.Type()) {
		return fmt.Errorf("%w: worker %s does not handle type %q", events.ErrInvalid, r.spec.Name, e.Type())
	}
	return nil
}

// deadLetter builds the letter the runtime would write, with the runtime's
// builder (events.NewDeadLetter) and the instance's test key, and reads it
// back through events.ParseDeadLetter, the one parser of the format.
func (r *Runner) deadLetter(it *queued, reason error, delivered uint64) events.DeadLetter {
	subject := r.subjectOf(it.e)
	msg, err := events.Encode(subject, it.e)
	if err != nil {
		msg = nats.NewMsg(subject)
	}
	consumer := r.spec.Name + "-" + r.spec.Instance
	dlq := events.DLQSubject(r.spec.Name, r.spec.Instance)
	letter, _ := events.NewDeadLetter(events.LetterSource{
		Consumer: consumer, DLQSubject: dlq, Stream: events.StreamEvents,
		Sequence: it.seq, Subject: subject, Delivered: delivered,
		Reason: redact.Line(reason.Error()), Header: msg.Header, Data: msg.Data,
		Signer: Signer(consumer),
	})
	return events.ParseDeadLetter(0, dlq, letter.Header, letter.Data)
}

// subjectOf is where a publisher would have put e: its kind's subject for
// its key, else the worker's first subject.
func (r *Runner) subjectOf(e event.Event) string {
	if k, ok := events.Lookup(e.Type()); ok {
		if s, err := k.SubjectFor(e.Subject()); err == nil {
			return s
		}
	}
	if len(r.spec.Subjects) > 0 {
		return r.spec.Subjects[0]
	}
	return events.EventsPrefix
}

// prepare fills what a publisher fills (id, time, source, content type,
// the subject attribute from the data's key), as publishing the event would
// before the runtime saw it. What still fails validation is dead-lettered.
func prepare(e *event.Event) {
	_, _ = publisher.New(nil).Prepare(e)
}

// panicked is a handler panic turned into a failure, as the runtime does.
type panicked struct{ msg string }

func (p *panicked) Error() string { return p.msg }

func call(ctx context.Context, h workers.Handler, d *workers.Delivery) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicked{msg: fmt.Sprintf("handler panicked on %s (event %s): %v", d.Key, d.Event.ID(), v)}
		}
	}()
	return h.Handle(ctx, d)
}

// NewBackend is a workers.Backend in memory with a fresh state, for a
// handler called directly on a workers.NewDelivery, past the validation
// Work applies (to show what the handler itself does with an event the
// runtime would refuse): its outcomes and stages land in the Result.
func NewBackend(t testing.TB) (workers.Backend, *Result) {
	res := &Result{t: t}
	return &memBackend{res: res, state: workers.NewMemoryState()}, res
}

// memBackend is the Runner's workers.Backend: everything lands in the
// Result of the call.
type memBackend struct {
	mu       sync.Mutex
	res      *Result
	state    *workers.State
	saveErr  error
	emitErrs map[string]error
}

func (b *memBackend) Emit(_ context.Context, e event.Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.emitErrs[OutcomeName(e)]; err != nil {
		return err
	}
	// A redelivery's outcome has the same id and is stored once, as the
	// stream's dedupe window does.
	for _, o := range b.res.Outcomes {
		if o.ID() == e.ID() {
			return nil
		}
	}
	b.res.Outcomes = append(b.res.Outcomes, e)
	return nil
}

func (b *memBackend) SaveStage(_ context.Context, d *workers.Delivery, stage json.RawMessage) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.saveErr != nil {
		return b.saveErr
	}
	b.res.Stages = append(b.res.Stages, Stage{Sequence: d.Sequence, EventID: d.Event.ID(), Stage: append(json.RawMessage(nil), stage...)})
	return nil
}

func (b *memBackend) State() *workers.State { return b.state }

// lastStage is the stage last saved for seq in this call, or def.
func (b *memBackend) lastStage(seq uint64, def json.RawMessage) json.RawMessage {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.res.Stages) - 1; i >= 0; i-- {
		if b.res.Stages[i].Sequence == seq {
			return b.res.Stages[i].Stage
		}
	}
	return def
}

// OutcomeName is the <outcome> of an outcome's type,
// dev.steward.<noun>.<outcome>.v1 ("applied", "superseded").
func OutcomeName(e event.Event) string {
	t := strings.TrimSuffix(e.Type(), ".v1")
	return t[strings.LastIndexByte(t, '.')+1:]
}

func readFile(t testing.TB, path string) []event.Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	list, err := events.ReadJSONL(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return list
}
