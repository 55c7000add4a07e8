// Package bothways runs a story of events through a worker's handler twice,
// in memory (workertest.Replay) and on the real runtime on an embedded
// server (workertest.Replay with WithRuntime), and checks that each run
// comes to the story's expected results and that the two come to the same
// ones: the same verdict for every event, the same outcomes in the same
// order for every key, the same dead letters and the same state documents.
//
// It is the proof issue 24 asks of workertest, for each of the four
// workers: a handler that passes in memory behaves the same on the runtime.
// Comparing each run with an expected list written in the story, and not
// only the two runs with each other, keeps a change that breaks both the
// same way from passing.
package bothways

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// Mode is one of the two ways a story is run.
type Mode int

// The two modes.
const (
	// InMemory is workertest.Replay with no server.
	InMemory Mode = iota + 1
	// OnRuntime is workertest.Replay with WithRuntime: workers.New and Run
	// on an embedded JetStream server.
	OnRuntime
)

func (m Mode) String() string {
	switch m {
	case InMemory:
		return "in memory"
	case OnRuntime:
		return "on the runtime"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Step is one event of a story and how a failure names it
// ("credential.rotated v2 for hive-1"). Run fills its id, time and source
// as a publisher would, in place: a Step that repeats another's Event (the
// same value, sharing its attributes) is the same event, with one id.
type Step struct {
	What  string
	Event event.Event
}

// Want is what a story must come to.
type Want struct {
	// Verdicts is each event's verdict, in stream order.
	Verdicts []workertest.Verdict
	// Outcomes are the outcomes emitted, each "<key> <outcome>"
	// ("hive-1 applied"). They are compared key by key, in order: the
	// runtime runs different keys side by side, so the order across keys
	// is not defined.
	Outcomes []string
	// DeadLetters are the dead letters in the stream order of their
	// events, each given by a text its reason must contain (the rule
	// broken, the field named). The runtime dead-letters the events of
	// different keys side by side, so the DLQ's own order is not defined.
	DeadLetters []string
	// State is the state documents the instance must hold after the
	// story, by name: each must be there and hold at least the top-level
	// fields given, with those values (compared as JSON), and no other
	// document may be there. Nil leaves them unchecked against the story;
	// the two runs' documents are compared with each other whole all the
	// same.
	State map[string]any
}

// Story is a short list of events for one instance and what it must come to.
type Story struct {
	Name  string
	Steps []Step
	Want  Want
	// KnownDivergence, when set, says how the two modes disagree today on
	// this story: only Right's run is held to Want, and the two runs are
	// not compared with each other. They must still disagree (with each
	// other, or the other run with Want), so the mark cannot outlive the
	// divergence: once they agree, the test fails until it is removed.
	KnownDivergence string
	// Right is the mode whose results are Want under KnownDivergence.
	Right Mode
}

// Worker is one fresh instance of the worker under test, for one run: its
// world (folders, database corner, fake cloud) is its own, so the two runs
// never see each other's effects.
type Worker struct {
	Spec    workers.Spec
	Handler workers.Handler
	// Runtime are the options of the worker on the runtime (WithRuntime).
	Runtime []workers.Option
	// Options are workertest's options of the run (WithAttempts, for a
	// story whose events the runtime may try before what they need has
	// run in another key's lane).
	Options []workertest.Option
}

// Runner runs the stories of one worker both ways.
type Runner struct {
	// New makes a fresh Worker for one run of one story.
	New func(t *testing.T, m Mode) Worker
	// Normalise, when set, rewrites what legitimately differs between two
	// runs in a state document or an outcome's data (a time, a name
	// chosen at random) so the rest can be compared. It is given the
	// document's name, or the outcome's type, and the decoded JSON.
	Normalise func(name string, doc any) any
}

// Run runs s in memory and on the runtime and reports every difference,
// from the story, and between the two runs, as an error of t naming the
// story, the event and what each mode said.
func (r Runner) Run(t *testing.T, s Story) {
	t.Helper()
	list := make([]event.Event, len(s.Steps))
	for i := range s.Steps {
		// Filled as a publisher fills them (id, time, source), once, so
		// both runs see the same events; what still fails validation is
		// for the runtime's check to dead-letter.
		_, _ = publisher.New(nil).Prepare(&s.Steps[i].Event)
		list[i] = s.Steps[i].Event
	}
	runs := map[Mode]*run{}
	for _, m := range []Mode{InMemory, OnRuntime} {
		w := r.New(t, m)
		opts := slices.Clone(w.Options)
		if m == OnRuntime {
			opts = append(opts, workertest.WithRuntime(w.Runtime...))
		}
		runs[m] = r.read(t, m, workertest.Replay(t, cloneAll(list), w.Spec, w.Handler, opts...))
	}
	want := expected(s.Want)
	if s.KnownDivergence == "" {
		for _, m := range []Mode{InMemory, OnRuntime} {
			for _, d := range runs[m].differences(want, s.Steps) {
				t.Errorf("story %q, %s: %s", s.Name, m, d)
			}
		}
		for _, d := range runs[InMemory].against(runs[OnRuntime], s.Steps) {
			t.Errorf("story %q: %s", s.Name, d)
		}
		return
	}
	wrong := InMemory
	if s.Right == InMemory {
		wrong = OnRuntime
	} else if s.Right != OnRuntime {
		t.Fatalf("story %q has a known divergence but no Right mode", s.Name)
	}
	for _, d := range runs[s.Right].differences(want, s.Steps) {
		t.Errorf("story %q, %s (the mode that is right under its known divergence): %s", s.Name, s.Right, d)
	}
	diffs := append(runs[wrong].differences(want, s.Steps), runs[InMemory].against(runs[OnRuntime], s.Steps)...)
	if len(diffs) == 0 {
		t.Errorf("story %q is marked with a known divergence (%s), but the two modes now agree: remove the mark", s.Name, s.KnownDivergence)
		return
	}
	t.Logf("story %q, known divergence (%s):\n\t%s", s.Name, s.KnownDivergence, strings.Join(diffs, "\n\t"))
}

// run is what one replay came to, read for comparing.
type run struct {
	verdicts    []workertest.Verdict
	outcomes    []string
	outcomeData map[string][]any
	deadLetters []deadLetter
	state       map[string]any
	// sequenceStep maps an event's stream sequence to its step.
	sequenceStep map[uint64]int
}

type deadLetter struct {
	step   int
	reason string
}

func (r Runner) read(t *testing.T, m Mode, res *workertest.Result) *run {
	t.Helper()
	out := &run{verdicts: res.Verdicts(), outcomeData: map[string][]any{}, state: map[string]any{}, sequenceStep: map[uint64]int{}}
	for i, e := range res.Events {
		if _, dup := out.sequenceStep[e.Sequence]; !dup {
			out.sequenceStep[e.Sequence] = i
		}
	}
	for _, o := range res.Outcomes {
		name := o.Subject() + " " + workertest.OutcomeName(o)
		out.outcomes = append(out.outcomes, name)
		out.outcomeData[o.Subject()] = append(out.outcomeData[o.Subject()], supersededByLater(t, m, r.decode(t, m, o.Type(), o.Data())))
	}
	for _, d := range res.DeadLetters {
		step, ok := out.sequenceStep[d.Sequence]
		if !ok {
			step = -1
		}
		out.deadLetters = append(out.deadLetters, deadLetter{step: step, reason: d.Reason})
	}
	slices.SortStableFunc(out.deadLetters, func(a, b deadLetter) int { return a.step - b.step })
	for name, raw := range res.State {
		out.state[name] = r.decode(t, m, name, raw)
	}
	return out
}

func (r Runner) decode(t *testing.T, m Mode, name string, raw []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %s is not JSON: %v", m, name, err)
	}
	if r.Normalise != nil {
		v = r.Normalise(name, v)
	}
	return v
}

// supersededByLater checks that a runtime superseded outcome
// (workers.Superseded) names a later event as the one that superseded it,
// and leaves out which: the runtime names the first newer verified event
// it finds, in its queue or by reading the stream before the head runs, so
// on the runtime which one is named depends on timing, while in memory it
// is always the highest ranked of the burst.
func supersededByLater(t *testing.T, m Mode, data any) any {
	t.Helper()
	doc, ok := data.(map[string]any)
	if !ok {
		return data
	}
	if _, ok := doc["supersededBy"]; !ok {
		return data
	}
	var s workers.Superseded
	raw, _ := json.Marshal(doc)
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%s: a superseded outcome %s does not decode: %v", m, raw, err)
	}
	if s.SupersededBy == "" || s.SupersededBySequence <= s.Sequence || s.Reason != "superseded by "+s.SupersededBy {
		t.Errorf("%s: the superseded outcome %s does not name a later event that superseded it", m, raw)
	}
	out := map[string]any{}
	for k, v := range doc {
		if k != "supersededBy" && k != "supersededBySequence" && k != "reason" {
			out[k] = v
		}
	}
	return out
}

// expected is Want in the shape a run is read into.
func expected(w Want) *run {
	out := &run{verdicts: w.Verdicts, outcomes: w.Outcomes}
	for _, reason := range w.DeadLetters {
		out.deadLetters = append(out.deadLetters, deadLetter{step: -1, reason: reason})
	}
	if w.State != nil {
		out.state = map[string]any{}
		for name, doc := range w.State {
			raw, err := json.Marshal(doc)
			if err != nil {
				panic(fmt.Sprintf("bothways: the expected state document %s does not encode: %v", name, err))
			}
			var v any
			_ = json.Unmarshal(raw, &v)
			out.state[name] = v
		}
	}
	return out
}

// differences lists how r falls short of want: an event's verdict, a key's
// outcomes, a dead letter's reason, a state document.
func (r *run) differences(want *run, steps []Step) []string {
	var out []string
	if len(r.verdicts) != len(want.verdicts) {
		out = append(out, fmt.Sprintf("%d verdicts %v, want %d %v", len(r.verdicts), r.verdicts, len(want.verdicts), want.verdicts))
	}
	for i := range min(len(r.verdicts), len(want.verdicts)) {
		if r.verdicts[i] != want.verdicts[i] {
			out = append(out, fmt.Sprintf("event %d (%s): %s, want %s", i+1, steps[i].What, r.verdicts[i], want.verdicts[i]))
		}
	}
	for _, key := range keysOf(r.outcomes, want.outcomes) {
		if got, w := ofKey(r.outcomes, key), ofKey(want.outcomes, key); !slices.Equal(got, w) {
			out = append(out, fmt.Sprintf("outcomes of key %s %v, want %v", key, got, w))
		}
	}
	if len(r.deadLetters) != len(want.deadLetters) {
		out = append(out, fmt.Sprintf("%d dead letters %s, want %d with reasons containing %q", len(r.deadLetters), reasons(r.deadLetters, steps), len(want.deadLetters), reasonTexts(want.deadLetters)))
	} else {
		for i, d := range r.deadLetters {
			if !strings.Contains(d.reason, want.deadLetters[i].reason) {
				out = append(out, fmt.Sprintf("dead letter %d (%s): reason %q does not contain %q", i+1, stepName(d.step, steps), d.reason, want.deadLetters[i].reason))
			}
		}
	}
	if want.state != nil {
		out = append(out, stateShortOf(r.state, want.state)...)
	}
	return out
}

// against lists how the in-memory run m and the runtime's run rt differ,
// in words that say what each mode did.
func (m *run) against(rt *run, steps []Step) []string {
	var out []string
	for i := range min(len(m.verdicts), len(rt.verdicts)) {
		if m.verdicts[i] != rt.verdicts[i] {
			out = append(out, fmt.Sprintf("event %d (%s): %s %s, %s %s", i+1, steps[i].What, InMemory, m.verdicts[i], OnRuntime, rt.verdicts[i]))
		}
	}
	for _, key := range keysOf(m.outcomes, rt.outcomes) {
		got, other := ofKey(m.outcomes, key), ofKey(rt.outcomes, key)
		if !slices.Equal(got, other) {
			out = append(out, fmt.Sprintf("outcomes of key %s: %s %v, %s %v", key, InMemory, got, OnRuntime, other))
			continue
		}
		a, b := m.outcomeData[key], rt.outcomeData[key]
		for i := range min(len(a), len(b)) {
			if !reflect.DeepEqual(a[i], b[i]) {
				out = append(out, fmt.Sprintf("outcome %d of key %s (%s): %s %s, %s %s", i+1, key, got[i], InMemory, jsonText(a[i]), OnRuntime, jsonText(b[i])))
			}
		}
	}
	if len(m.deadLetters) != len(rt.deadLetters) {
		out = append(out, fmt.Sprintf("dead letters: %s %s, %s %s", InMemory, reasons(m.deadLetters, steps), OnRuntime, reasons(rt.deadLetters, steps)))
	} else {
		for i := range m.deadLetters {
			if m.deadLetters[i].step != rt.deadLetters[i].step {
				out = append(out, fmt.Sprintf("dead letter %d: %s of %s, %s of %s", i+1, InMemory, stepName(m.deadLetters[i].step, steps), OnRuntime, stepName(rt.deadLetters[i].step, steps)))
			}
		}
	}
	out = append(out, stateDifferences(m.state, rt.state)...)
	return out
}

// stateShortOf lists how the documents got fall short of want: a document
// missing or not wanted, a field wanted with another value.
func stateShortOf(got, want map[string]any) []string {
	var out []string
	for _, n := range sortedNames(got, want) {
		g, inGot := got[n]
		w, inWant := want[n]
		switch {
		case !inGot:
			out = append(out, fmt.Sprintf("no state document %s, want one holding %s", n, jsonText(w)))
			continue
		case !inWant:
			out = append(out, fmt.Sprintf("state document %s is %s, want none", n, jsonText(g)))
			continue
		}
		gd, _ := g.(map[string]any)
		wd, ok := w.(map[string]any)
		if !ok || gd == nil {
			if !reflect.DeepEqual(g, w) {
				out = append(out, fmt.Sprintf("state document %s is %s, want %s", n, jsonText(g), jsonText(w)))
			}
			continue
		}
		for _, f := range sortedNames(wd) {
			if !reflect.DeepEqual(gd[f], wd[f]) {
				out = append(out, fmt.Sprintf("state document %s has %s %s, want %s", n, f, jsonText(gd[f]), jsonText(wd[f])))
			}
		}
	}
	return out
}

func sortedNames(maps ...map[string]any) []string {
	var out []string
	for _, m := range maps {
		for n := range m {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// stateDifferences lists the documents in which the in-memory run's
// state m and the runtime's rt differ.
func stateDifferences(m, rt map[string]any) []string {
	var out []string
	for _, n := range sortedNames(m, rt) {
		a, inM := m[n]
		b, inRT := rt[n]
		if inM != inRT || !reflect.DeepEqual(a, b) {
			out = append(out, fmt.Sprintf("state document %s: %s %s, %s %s", n, InMemory, docText(a, inM), OnRuntime, docText(b, inRT)))
		}
	}
	return out
}

func docText(doc any, present bool) string {
	if !present {
		return "none"
	}
	return jsonText(doc)
}

// keysOf lists the keys of two lists of "<key> <outcome>", in the order
// they first appear.
func keysOf(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, o := range l {
			k, _, _ := strings.Cut(o, " ")
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out
}

func ofKey(outcomes []string, key string) []string {
	out := []string{}
	for _, o := range outcomes {
		if k, name, _ := strings.Cut(o, " "); k == key {
			out = append(out, name)
		}
	}
	return out
}

func stepName(i int, steps []Step) string {
	if i < 0 || i >= len(steps) {
		return "an event of no step"
	}
	return fmt.Sprintf("event %d, %s", i+1, steps[i].What)
}

func reasons(list []deadLetter, steps []Step) string {
	var parts []string
	for _, d := range list {
		parts = append(parts, fmt.Sprintf("[%s: %q]", stepName(d.step, steps), d.reason))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func reasonTexts(list []deadLetter) []string {
	var out []string
	for _, d := range list {
		out = append(out, d.reason)
	}
	return out
}

func jsonText(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%v", v)
	}
	return string(raw)
}

// cloneAll copies events deeply: an event's attributes live behind a
// pointer, and a replay fills them in place.
func cloneAll(list []event.Event) []event.Event {
	out := make([]event.Event, len(list))
	for i, e := range list {
		out[i] = e.Clone()
	}
	return out
}

// Raw is an event of type typ for key with data, made as a client that
// sets NATS headers itself can make it, past the checks events.New and the
// publisher apply: what an attacker sends, for the runtime's own checks.
// data that is a []byte is taken as it is; anything else is encoded.
func Raw(t testing.TB, typ, key string, data any) event.Event {
	t.Helper()
	raw, ok := data.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(data); err != nil {
			t.Fatalf("the data of a raw %s event does not encode: %v", typ, err)
		}
	}
	e := event.New()
	e.SetType(typ)
	e.SetSubject(key)
	if err := e.SetData("application/json", raw); err != nil {
		t.Fatal(err)
	}
	return e
}
