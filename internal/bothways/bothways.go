// Package bothways runs a story of events through a worker's handler twice,
// in memory (workertest.Replay) and on the real runtime on an embedded
// server (workertest.Replay with WithRuntime), and checks that each run
// comes to the story's expected results and that the two come to the same
// ones: the same verdict for every event, the same outcomes (names and
// data) in the same order for every key, the same dead letters, the same
// state documents, and the same effects outside the bus (the files or
// database rows the handler changed, as the worker's test reads them).
//
// It is the proof issue 24 asks of workertest, for each of the four
// workers: a handler that passes in memory behaves the same on the runtime.
// Comparing each run with an expected list written in the story, and not
// only the two runs with each other, keeps a change that breaks both the
// same way from passing.
package bothways

import (
	"fmt"
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
	// fields given, with those values (compared as JSON; an empty one must
	// be empty), and no other document may be there. Nil leaves them unchecked against the story;
	// the two runs' documents are compared with each other whole all the
	// same.
	State map[string]any
	// Effects are what the handler must have done outside the bus (the
	// Worker's Effects: files, database rows), by name, each compared as
	// State's documents are: at least the fields given. Nil leaves them
	// unchecked against the story; the two runs' are compared all the
	// same.
	Effects map[string]any
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
	// Effects, when set, reads what the handler did outside the bus once
	// the run is over (the files it wrote, the rows of its database), by
	// name, as JSON-encodable values; nothing secret.
	Effects func(t *testing.T) map[string]any
}

// Runner runs the stories of one worker both ways.
type Runner struct {
	// New makes a fresh Worker for one run of one story.
	New func(t *testing.T, m Mode) Worker
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
		runs[m] = read(t, m, workertest.Replay(t, cloneAll(list), w.Spec, w.Handler, opts...))
		if w.Effects != nil {
			runs[m].effects = asJSON(w.Effects(t))
		}
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

// cloneAll copies events deeply: an event's attributes live behind a
// pointer, and a replay fills them in place.
func cloneAll(list []event.Event) []event.Event {
	out := make([]event.Event, len(list))
	for i, e := range list {
		out[i] = e.Clone()
	}
	return out
}
