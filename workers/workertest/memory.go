package workertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/internal/enginetest"
	"github.com/steward-dev/steward/workers/internal/memory"
)

// Runner runs events through one handler in memory, with no server, on the
// runtime's own engine: the keyed queue, the executor and the settler that
// a worker runs in production, over a checkpoint bucket, streams and
// messages kept in memory (and documents signed and verified with the
// instance's test key, DocumentKeys). Its State, its checkpoints and the
// stages saved last across calls, and every event gets the next stream
// sequence, so a test can run a story event by event and look at each
// step.
//
// So the runtime's rules apply as they do on a server: validation (an
// event that fails events.Validate, is not of Spec.Types, or whose subject
// names another key goes to the DLQ unhandled); results (nil is applied,
// workers.Refused is settled as refused, workers.Permanent is
// dead-lettered with its reason, a panic is tried again up to
// WithMaxPanics times, then dead-lettered); order (one key's events one at
// a time in stream order, those behind a failing event Waiting);
// latest-wins (the events given to one call are queued together, as a
// burst is pulled, so under Spec.Rank an event that a later verified event
// of its key ranks at or above is Superseded, with the runtime's outcome);
// checkpoints (what is applied is recorded, a stage saved is what a
// redelivery finds) and outcomes and dead letters as the runtime writes
// them, deduplicated by id.
//
// What differs from a server, and why: a plain error is tried again at
// once rather than after a backoff, and only WithAttempts times (once by
// default), then reported Retried with the events behind it Waiting, and
// handed back; nothing redelivers it in a later call (Redelivered runs an
// event as a redelivery). Crashes, heartbeats, shutdown, other processes
// of the instance and events arriving while a lane runs are the server's:
// WithRuntime runs the real runtime on an embedded server for those.
type Runner struct {
	t        testing.TB
	spec     workers.Spec
	attempts int

	engine  enginetest.Engine
	kv      *memory.KV
	streams *memory.Streams

	// mu is held by a call for its whole run; recMu guards call, which
	// the engine's goroutines report to while it runs.
	mu    sync.Mutex
	recMu sync.Mutex
	call  *call
}

// call is what one call of a Runner records as the engine runs it.
type call struct {
	byID     map[uint64]string
	tried    map[uint64]*Settled
	settled  map[uint64]Verdict
	stages   []Stage
	saveErr  error
	emitErrs map[string]error
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
	t.Helper()
	r := &Runner{t: t, spec: spec, attempts: c.attempts, kv: memory.NewKV(events.CheckpointBucket), streams: memory.NewStreams()}
	r.kv.Fail, r.kv.Written = r.failWrite, r.written
	r.streams.Fail = r.failPublish
	engine, err := enginetest.NewEngine(enginetest.Config{
		Spec:    spec,
		Handler: workers.HandlerFunc(r.observe(h)),
		Options: []any{
			workers.WithLogger(c.log), workers.WithMaxPanics(c.maxPanics),
			DocumentKeys(spec.Name, spec.Instance), workers.WithSettledHook(r.settled),
		},
		KV: r.kv, Streams: r.streams, MaxFailures: c.attempts,
	})
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	r.engine = engine
	return r
}

// State is the worker instance's state, kept across calls, signed as the
// runtime signs it. A test may seed it before the first event (the
// installed version, a floor).
func (r *Runner) State() *workers.State { return r.engine.State().(*workers.State) }

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
	return r.run(ReadFile(r.t, path), opts)
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
	stage     json.RawMessage
	attempt   uint64
	unchecked bool
	saveErr   error
	emitErrs  map[string]error
}

// Redelivered delivers the event again, as after a crash: Attempt is 2 and
// LoadStage finds stage, as an earlier delivery of the same event saved it
// in the key's checkpoint.
func Redelivered(stage any) WorkOption {
	return func(w *work) {
		raw, err := json.Marshal(stage)
		if err != nil {
			panic(fmt.Sprintf("workertest.Redelivered: the stage does not encode: %v", err))
		}
		w.stage, w.attempt = raw, 2
	}
}

// SaveStageFails makes every write of a checkpoint fail with err, as when
// the checkpoint bucket is down: SaveStage returns it, and an event the
// handler settles cannot be recorded either (wrap events.ErrConflict for
// another process having moved the key on).
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

// Unchecked hands the events to the handler without the runtime's
// validation, to show what the handler itself does with data the schema,
// the type check or the subject check would have refused: its own checks
// are the defence in depth behind them.
func Unchecked() WorkOption { return func(w *work) { w.unchecked = true } }

func (r *Runner) run(list []event.Event, opts []WorkOption) *Result {
	r.t.Helper()
	var wo work
	for _, o := range opts {
		o(&wo)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	outcomesBefore := len(r.streams.Messages(events.StreamOutcomes))
	lettersBefore := len(r.streams.Messages(events.StreamDLQ))
	c := &call{byID: map[uint64]string{}, tried: map[uint64]*Settled{}, settled: map[uint64]Verdict{}}

	// Each event is stored as a publish stores it: once per id in one
	// call, as inside the stream's dedupe window (a copy is the first's
	// event, and reports what became of it); an event on a subject the
	// worker does not consume is stored and never delivered.
	msgs := make([]*memory.Msg, len(list))
	first := map[string]*memory.Msg{}
	var deliver []*memory.Msg
	for i := range list {
		e := list[i]
		prepare(&e)
		list[i] = e
		if m, ok := first[e.ID()]; ok {
			msgs[i] = m
			continue
		}
		subject := subjectOf(r.spec, e)
		msg, err := events.Encode(subject, e)
		if err != nil {
			r.t.Fatalf("event %s: %v", e.ID(), err)
		}
		seq := r.streams.Append(events.StreamEvents, msg)
		c.byID[seq] = e.ID()
		msgs[i] = memory.NewMsg(r.streams.Messages(events.StreamEvents)[seq-1], max(wo.attempt, 1))
		first[e.ID()] = msgs[i]
		if !wo.unchecked && !consumes(r.spec, subject) {
			continue
		}
		if wo.stage != nil {
			r.seedStage(e, seq, wo.stage)
		}
		deliver = append(deliver, msgs[i])
	}
	// Faults and the record of stages apply from here on: the stage a
	// redelivery finds was seeded, not saved by this call.
	r.setCall(c, wo)
	r.engine.Deliver(deliver, wo.unchecked)
	r.setCall(nil, work{})

	res := &Result{t: r.t}
	for _, m := range r.streams.Messages(events.StreamOutcomes)[outcomesBefore:] {
		e, err := events.Decode(m.Header, m.Data)
		if err != nil {
			r.t.Fatalf("outcome at %s sequence %d: %v", events.StreamOutcomes, m.Sequence, err)
		}
		res.Outcomes = append(res.Outcomes, e)
	}
	letters := map[uint64]events.DeadLetter{}
	for _, m := range r.streams.Messages(events.StreamDLQ)[lettersBefore:] {
		l := events.ParseDeadLetter(m.Sequence, m.Subject, m.Header, m.Data)
		res.DeadLetters = append(res.DeadLetters, l)
		letters[l.Sequence] = l
	}
	for i, e := range list {
		meta, _ := msgs[i].Metadata()
		res.Events = append(res.Events, r.settledOf(c, e, meta.Sequence.Stream, msgs[i], letters))
	}
	res.Stages = c.stages
	docs, err := r.State().Documents(context.Background())
	if err != nil {
		r.t.Fatalf("state: %v", err)
	}
	res.State = docs
	return res
}

// settledOf is what became of e, stored at seq and delivered as msg, as
// the engine settled it.
func (r *Runner) settledOf(c *call, e event.Event, seq uint64, msg *memory.Msg, letters map[uint64]events.DeadLetter) Settled {
	s := Settled{Sequence: seq, ID: e.ID(), Type: e.Type()}
	if t := c.tried[seq]; t != nil {
		s.Attempts, s.Err = t.Attempts, t.Err
	}
	if events.Validate(e) == nil {
		s.Key = e.Subject()
		if r.spec.OrderKey != nil {
			s.Key = r.spec.OrderKey(e)
		}
	}
	how, _ := msg.Settled()
	switch v, ok := c.settled[seq]; {
	case how == memory.Pending && !consumes(r.spec, msg.Subject()):
		s.Verdict = Undelivered
	case ok:
		s.Verdict = v
		if v != Refused {
			s.Err = nil
		}
	case how == memory.Termed:
		s.Verdict = DeadLettered
		if s.Err == nil || !workers.IsPermanent(s.Err) {
			s.Err = workers.Permanent(errorText(letters[seq].Reason))
		}
	case how == memory.Naked && s.Attempts > 0:
		s.Verdict = Retried
	case how == memory.Naked:
		s.Verdict = Waiting
	default:
		r.t.Fatalf("event %s at sequence %d was neither settled nor handed back by the engine (%q)", e.ID(), seq, how)
	}
	return s
}

// seedStage writes stage into the checkpoint of e's key as saved for the
// event at seq, through the engine's own store (so its signature and
// counter are the instance's), for a redelivery to find.
func (r *Runner) seedStage(e event.Event, seq uint64, stage json.RawMessage) {
	ctx := context.Background()
	key := e.Subject()
	if r.spec.OrderKey != nil {
		key = r.spec.OrderKey(e)
	}
	k := events.LaneCheckpointKey(r.spec.Name, r.spec.Instance, events.Lane(e.Type(), key))
	store := r.engine.Store()
	doc, err := store.Get(ctx, k)
	if err != nil {
		r.t.Fatalf("workertest.Redelivered: %v", err)
	}
	var cp events.Checkpoint
	if doc.Trusted {
		if err := doc.Decode(&cp); err != nil {
			r.t.Fatalf("workertest.Redelivered: %v", err)
		}
	}
	cp.StageSeq, cp.Stage = seq, stage
	if _, err := store.Put(ctx, k, cp, doc.Revision); err != nil {
		r.t.Fatalf("workertest.Redelivered: %v", err)
	}
}

func (r *Runner) setCall(c *call, wo work) {
	if c != nil {
		c.saveErr, c.emitErrs = wo.saveErr, wo.emitErrs
	}
	r.recMu.Lock()
	r.call = c
	r.recMu.Unlock()
}

// record changes the call under way, if any, under recMu: the engine's
// goroutines report to it.
func (r *Runner) record(fn func(c *call)) {
	r.recMu.Lock()
	defer r.recMu.Unlock()
	if r.call != nil {
		fn(r.call)
	}
}

// observe wraps h to record each run of the handler: attempts and the last
// error, a panic included (as the runtime words it), which it passes on
// for the executor to catch.
func (r *Runner) observe(h workers.Handler) func(context.Context, *workers.Delivery) error {
	return func(ctx context.Context, d *workers.Delivery) (err error) {
		defer func() {
			v := recover()
			if v != nil {
				// Only counted: a panic ends dead-lettered, or applied
				// or failed at a later attempt, and the Result's error
				// is then the letter's reason (the executor's words) or
				// that attempt's.
				err = fmt.Errorf("panic: %v", v)
			}
			r.record(func(c *call) {
				s := c.tried[d.Sequence]
				if s == nil {
					s = &Settled{}
					c.tried[d.Sequence] = s
				}
				s.Attempts++
				s.Err = err
			})
			if v != nil {
				panic(v)
			}
		}()
		return h.Handle(ctx, d)
	}
}

// settled records the runtime's result for an event whose ack it
// confirmed.
func (r *Runner) settled(s workers.Settlement) {
	r.record(func(c *call) { c.settled[s.Sequence] = Verdict(s.Result) })
}

// failWrite is the bucket's fault for SaveStageFails: every checkpoint
// write fails.
func (r *Runner) failWrite(key string) (err error) {
	if events.InfoOf(key).Kind == events.KindCheckpoint {
		r.record(func(c *call) { err = c.saveErr })
	}
	return err
}

// written records a stage as the engine saves it into a checkpoint.
func (r *Runner) written(key string, value []byte) {
	var cp events.Checkpoint
	if events.InfoOf(key).Kind != events.KindCheckpoint || json.Unmarshal(value, &cp) != nil || cp.StageSeq == 0 || len(cp.Stage) == 0 {
		return
	}
	r.record(func(c *call) {
		if id, ok := c.byID[cp.StageSeq]; ok {
			c.stages = append(c.stages, Stage{Sequence: cp.StageSeq, EventID: id, Stage: append(json.RawMessage(nil), cp.Stage...)})
		}
	})
}

// failPublish is the streams' fault for EmitFails.
func (r *Runner) failPublish(msg *nats.Msg, stream string) (err error) {
	if stream != events.StreamOutcomes {
		return nil
	}
	e, derr := events.Decode(msg.Header, msg.Data)
	if derr != nil {
		return nil
	}
	r.record(func(c *call) { err = c.emitErrs[OutcomeName(e)] })
	return err
}

// consumes says whether a worker of spec is delivered events stored on
// subject: one of its Subjects matches it, as its consumer's filter does.
func consumes(spec workers.Spec, subject string) bool {
	return slices.ContainsFunc(spec.Subjects, func(f string) bool { return events.FilterCovers(f, subject) })
}

// subjectOf is where a publisher would have put e: its kind's subject for
// its key, else the worker's first subject.
func subjectOf(spec workers.Spec, e event.Event) string {
	if k, ok := events.Lookup(e.Type()); ok {
		if s, err := k.SubjectFor(e.Subject()); err == nil {
			return s
		}
	}
	if len(spec.Subjects) > 0 {
		return spec.Subjects[0]
	}
	return events.EventsPrefix
}

// prepare fills what a publisher fills (id, time, source, content type,
// the subject attribute from the data's key), as publishing the event would
// before the runtime saw it. What still fails validation is dead-lettered.
func prepare(e *event.Event) {
	_, _ = publisher.New(nil).Prepare(e)
}

// OutcomeName is the <outcome> of an outcome's type,
// dev.steward.<noun>.<outcome>.v1 ("applied", "superseded").
func OutcomeName(e event.Event) string {
	t := strings.TrimSuffix(e.Type(), ".v1")
	return t[strings.LastIndexByte(t, '.')+1:]
}

// ReadFile reads a recorded stream, CloudEvents in the JSON format one per
// line as `steward export` writes them, failing the test with the file's
// name and the line that does not read.
func ReadFile(t testing.TB, path string) []event.Event {
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

// errorText is a dead letter's reason as an error.
type errorText string

func (e errorText) Error() string { return string(e) }
