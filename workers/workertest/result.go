package workertest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/workers"
)

// Verdict is what became of one event: the runtime's result for it.
type Verdict string

// The verdicts, named as the runtime counts them (steward_events_total).
const (
	// Applied: the handler returned nil.
	Applied Verdict = "applied"
	// Refused: the handler returned workers.Refused after its refused
	// outcome; settled, never dead-lettered.
	Refused Verdict = "refused"
	// Superseded: a newer verified event of its key was queued behind it
	// under a latest-wins Spec; it never reached the handler.
	Superseded Verdict = "superseded"
	// DeadLettered: invalid, workers.Permanent, or a panic too many times.
	DeadLettered Verdict = "dead_lettered"
	// Retried: a plain error; the runtime would try it again after a
	// backoff, and hold the later events of its key behind it.
	Retried Verdict = "retried"
	// Waiting: queued behind a Retried event of its key, not run.
	Waiting Verdict = "waiting"
	// Skipped: older than the event last applied for its key (a late
	// redelivery).
	Skipped Verdict = "skipped"
	// Undelivered: stored on a subject the worker does not consume (none
	// of Spec.Subjects matches it), so a server never delivers it to this
	// worker and nothing happens. Not a count of the runtime's: it never
	// sees the event.
	Undelivered Verdict = "undelivered"
)

// Settled is what became of one event of a run.
type Settled struct {
	Sequence      uint64
	ID, Type, Key string
	Verdict       Verdict
	// Err is the handler's error (Refused, Retried, DeadLettered) or why
	// the event is invalid; nil when Applied or Superseded.
	Err error
	// Attempts counts the handler's runs (panics are tried again).
	Attempts int
}

// Stage is one stage a handler saved (Delivery.SaveStage).
type Stage struct {
	Sequence uint64
	EventID  string
	Stage    json.RawMessage
}

// Result is what a run did, in the style of httptest.ResponseRecorder: the
// fields are there to read, and the Assert methods check them, reporting
// through the run's testing.TB.
type Result struct {
	t testing.TB
	// Events is what became of each event, in stream order.
	Events []Settled
	// Outcomes are the outcomes emitted, in order, superseded ones
	// included: the events the runtime publishes on
	// steward.outcomes.<worker>.<instance>.
	Outcomes []event.Event
	// DeadLetters are the events dead-lettered, as events.DeadLetter reads
	// them from STEWARD_DLQ.
	DeadLetters []events.DeadLetter
	// Stages are the stages saved, in order. With WithRuntime only the
	// last one of each handler run is seen.
	Stages []Stage
	// State is the worker instance's state after the run, by document
	// name, as stored (JSON).
	State map[string]json.RawMessage
}

// Err is the errors of the run's events joined (nil when none failed or
// was refused); for one event, its error as the handler returned it.
func (r *Result) Err() error {
	var errs []error
	for _, s := range r.Events {
		if s.Err != nil {
			errs = append(errs, s.Err)
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// Verdicts lists each event's verdict, in order.
func (r *Result) Verdicts() []Verdict {
	out := make([]Verdict, len(r.Events))
	for i, s := range r.Events {
		out[i] = s.Verdict
	}
	return out
}

// OutcomeNames lists the outcomes' names (OutcomeName), in order.
func (r *Result) OutcomeNames() []string {
	out := make([]string, len(r.Outcomes))
	for i, o := range r.Outcomes {
		out[i] = OutcomeName(o)
	}
	return out
}

// AssertVerdicts checks each event's verdict, in order.
func (r *Result) AssertVerdicts(want ...Verdict) {
	r.t.Helper()
	if got := r.Verdicts(); !slices.Equal(got, want) {
		r.t.Errorf("verdicts %v, want %v%s", got, want, r.errorsText())
	}
}

// AssertOutcomes checks the names of the outcomes emitted, in order
// ("applied", "refused", "superseded": the <outcome> of
// dev.steward.<noun>.<outcome>.v1).
func (r *Result) AssertOutcomes(want ...string) {
	r.t.Helper()
	if got := r.OutcomeNames(); !slices.Equal(got, want) {
		r.t.Errorf("outcomes %v, want %v%s", got, want, r.errorsText())
	}
}

// Outcome returns the last outcome named name, and fails the test at once
// when there is none.
func (r *Result) Outcome(name string) event.Event {
	r.t.Helper()
	for i := len(r.Outcomes) - 1; i >= 0; i-- {
		if OutcomeName(r.Outcomes[i]) == name {
			return r.Outcomes[i]
		}
	}
	r.t.Fatalf("no %s outcome among %v%s", name, r.OutcomeNames(), r.errorsText())
	return event.Event{}
}

// OutcomeAs decodes the data of r's last outcome named name into a T, and
// fails the test at once when there is none or it does not decode.
func OutcomeAs[T any](r *Result, name string) T {
	r.t.Helper()
	var v T
	o := r.Outcome(name)
	if err := o.DataAs(&v); err != nil {
		r.t.Fatalf("the %s outcome %s does not decode as %T: %v", name, o.Data(), v, err)
	}
	return v
}

// DataAs decodes the data of an outcome of type wantType into a T and fails
// t at once when e is of another type or does not decode: for outcomes read
// from a real stream (Outcomes) rather than a Result.
func DataAs[T any](t testing.TB, e event.Event, wantType string) T {
	t.Helper()
	var v T
	if e.Type() != wantType {
		t.Fatalf("outcome type %s, want %s", e.Type(), wantType)
	}
	if err := e.DataAs(&v); err != nil {
		t.Fatalf("outcome %s does not decode as %T: %v", e.Type(), v, err)
	}
	return v
}

// AssertDeadLetters checks there is one dead letter per reason given, in
// order, each reason containing its text; none given, that there is none.
func (r *Result) AssertDeadLetters(reasonContains ...string) {
	r.t.Helper()
	if len(r.DeadLetters) != len(reasonContains) {
		var reasons []string
		for _, d := range r.DeadLetters {
			reasons = append(reasons, d.Reason)
		}
		r.t.Errorf("%d dead letters %q, want %d", len(r.DeadLetters), reasons, len(reasonContains))
		return
	}
	for i, want := range reasonContains {
		if !strings.Contains(r.DeadLetters[i].Reason, want) {
			r.t.Errorf("dead letter %d: reason %q does not contain %q", i, r.DeadLetters[i].Reason, want)
		}
	}
}

// AssertState checks that the state document name holds want, compared as
// JSON (field order and spacing do not matter).
func (r *Result) AssertState(name string, want any) {
	r.t.Helper()
	got, ok := r.State[name]
	if !ok {
		r.t.Errorf("no state document %q (have %v)", name, keys(r.State))
		return
	}
	if !sameJSON(r.t, got, want) {
		raw, _ := json.Marshal(want)
		r.t.Errorf("state %s is %s, want %s", name, got, raw)
	}
}

// StateAs decodes the state document name into a T and fails the test at
// once when there is none or it does not decode.
func StateAs[T any](r *Result, name string) T {
	r.t.Helper()
	var v T
	raw, ok := r.State[name]
	if !ok {
		r.t.Fatalf("no state document %q (have %v)", name, keys(r.State))
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		r.t.Fatalf("state %s (%s) does not decode as %T: %v", name, raw, v, err)
	}
	return v
}

// AssertStages checks the stages saved, in order, each compared as JSON.
func (r *Result) AssertStages(want ...any) {
	r.t.Helper()
	if len(r.Stages) != len(want) {
		r.t.Errorf("%d stages saved %s, want %d", len(r.Stages), r.stagesText(), len(want))
		return
	}
	for i, w := range want {
		if !sameJSON(r.t, r.Stages[i].Stage, w) {
			raw, _ := json.Marshal(w)
			r.t.Errorf("stage %d is %s, want %s", i, r.Stages[i].Stage, raw)
		}
	}
}

// errorsText is what a failed assertion adds so the failure says why.
func (r *Result) errorsText() string {
	var b strings.Builder
	for _, s := range r.Events {
		if s.Err != nil {
			// A failed test's output is a log CI keeps: secrets elided.
			fmt.Fprintf(&b, "\n\tevent %s (seq %d) %s: %s", s.ID, s.Sequence, s.Verdict, redact.Line(s.Err.Error()))
		}
	}
	return b.String()
}

func (r *Result) stagesText() string {
	var parts []string
	for _, s := range r.Stages {
		parts = append(parts, string(s.Stage))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func sameJSON(t testing.TB, got json.RawMessage, want any) bool {
	t.Helper()
	raw, ok := want.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(want); err != nil {
			t.Fatalf("the expected value does not encode: %v", err)
		}
	}
	var a, b any
	if json.Unmarshal(got, &a) != nil || json.Unmarshal(raw, &b) != nil {
		return bytes.Equal(got, raw)
	}
	return reflect.DeepEqual(a, b)
}

func keys(m map[string]json.RawMessage) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Option configures a Runner, Replay or ReplayFile.
type Option func(*config)

type config struct {
	log        zerolog.Logger
	maxPanics  int
	attempts   int
	runtime    bool
	runtimeOpt []workers.Option
}

func newConfig(opts []Option) config {
	c := config{log: zerolog.Nop(), maxPanics: workers.DefaultMaxPanics, attempts: 1}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithLogger gives handlers a logger (Delivery.Log); the default discards.
func WithLogger(l zerolog.Logger) Option { return func(c *config) { c.log = l } }

// WithMaxPanics is workers.WithMaxPanics for the in-memory run.
func WithMaxPanics(n int) Option { return func(c *config) { c.maxPanics = max(n, 1) } }

// WithAttempts lets an event whose handler fails with an ordinary error run
// up to n times before it is reported Retried (the default, 1, reports it at
// its first failure), so a test can show that a transient failure applies
// once it passes. In memory the attempts run one after the other; on the
// runtime (WithRuntime) they are the runtime's own retries, after its
// backoff (workers.WithMaxBackoff shortens it).
func WithAttempts(n int) Option { return func(c *config) { c.attempts = max(n, 1) } }

// WithRuntime makes Replay and ReplayFile run the real runtime
// (workers.New and Run) on an embedded JetStream server instead of in
// memory, with opts for the worker: every event is published, and the run
// ends once each has settled, been dead-lettered or failed as many times as
// WithAttempts allows (once by default).
func WithRuntime(opts ...workers.Option) Option {
	return func(c *config) { c.runtime, c.runtimeOpt = true, opts }
}
