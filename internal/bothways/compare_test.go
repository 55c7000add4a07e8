package bothways

import (
	"slices"
	"strings"
	"testing"

	"github.com/steward-dev/steward/workers/workertest"
)

// The comparison's rules, each shown to catch what it is for: a failure
// message names the story's event and what each mode said, outcomes are
// held in order within a key but not across keys, a state document named
// in a story must hold the fields given, and an empty one must be empty.
func TestComparison(t *testing.T) {
	steps := []Step{{What: "credential.rotated v1 for hive-1"}, {What: "credential.rotated v2 for hive-1"}, {What: "hostfloor.published 1.0.0 for dep"}}
	base := func() *run {
		return &run{
			verdicts:    []workertest.Verdict{workertest.Superseded, workertest.Applied, workertest.Applied},
			outcomes:    []string{"hive-1 superseded", "dep floor-accepted", "hive-1 applied"},
			outcomeData: map[string][]any{},
			deadLetters: []deadLetter{{step: 2, reason: `invalid event: /hive: does not match pattern`}},
			state:       map[string]any{"floor": map[string]any{"sequence": 3.0, "eventId": "e-3"}},
			effects:     map[string]any{"pair": map[string]any{"clientId": "client-2"}},
		}
	}
	want := expected(Want{
		Verdicts:    []workertest.Verdict{workertest.Superseded, workertest.Applied, workertest.Applied},
		Outcomes:    []string{"dep floor-accepted", "hive-1 superseded", "hive-1 applied"},
		DeadLetters: []string{"/hive"},
		State:       map[string]any{"floor": map[string]any{"sequence": 3}},
		Effects:     map[string]any{"pair": map[string]any{"clientId": "client-2"}},
	})
	if d := base().differences(want, steps); len(d) != 0 {
		t.Fatalf("a run that is what the story wants, across keys in another order, differs: %q", d)
	}
	if d := base().against(base(), steps); len(d) != 0 {
		t.Fatalf("two equal runs differ: %q", d)
	}

	cases := []struct {
		name   string
		change func(r *run)
		vsWant []string // texts the differences from the story hold
		vsRun  []string // texts the differences from the unchanged run hold
	}{
		{
			name:   "a verdict",
			change: func(r *run) { r.verdicts[1] = workertest.Superseded },
			vsWant: []string{"event 2 (credential.rotated v2 for hive-1): superseded, want applied"},
			vsRun:  []string{"event 2 (credential.rotated v2 for hive-1): in memory superseded, on the runtime applied"},
		},
		{
			name:   "the order within a key",
			change: func(r *run) { r.outcomes = []string{"hive-1 applied", "dep floor-accepted", "hive-1 superseded"} },
			vsWant: []string{"outcomes of key hive-1 [applied superseded], want [superseded applied]"},
			vsRun:  []string{"outcomes of key hive-1: in memory [applied superseded], on the runtime [superseded applied]"},
		},
		{
			name:   "a dead letter's reason",
			change: func(r *run) { r.deadLetters[0].reason = "invalid event: /version: is below the minimum 1" },
			vsWant: []string{`dead letter 1 (event 3, hostfloor.published 1.0.0 for dep): reason "invalid event: /version: is below the minimum 1" does not contain "/hive"`},
		},
		{
			name:   "a field of a state document",
			change: func(r *run) { r.state["floor"] = map[string]any{"sequence": 1.0, "eventId": "e-3"} },
			vsWant: []string{"state document floor has sequence 1, want 3"},
			vsRun:  []string{`state document floor: in memory {"eventId":"e-3","sequence":1}, on the runtime {"eventId":"e-3","sequence":3}`},
		},
		{
			name:   "a field of a document the story does not name",
			change: func(r *run) { r.state["floor"] = map[string]any{"sequence": 3.0, "eventId": "e-4"} },
			vsRun:  []string{`state document floor: in memory {"eventId":"e-4","sequence":3}, on the runtime {"eventId":"e-3","sequence":3}`},
		},
		{
			name:   "a document the story does not want",
			change: func(r *run) { r.state["invitation"] = map[string]any{"sequence": 2.0} },
			vsWant: []string{`state document invitation is {"sequence":2}, want none`},
			vsRun:  []string{`state document invitation: in memory {"sequence":2}, on the runtime none`},
		},
		{
			name:   "an effect",
			change: func(r *run) { r.effects["pair"] = map[string]any{} },
			vsWant: []string{`effect pair has clientId null, want "client-2"`},
			vsRun:  []string{`effect pair: in memory {}, on the runtime {"clientId":"client-2"}`},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := base()
			c.change(r)
			if got := r.differences(want, steps); !holdsAll(got, c.vsWant) || len(c.vsWant) == 0 && len(got) != 0 {
				t.Errorf("differences from the story %q, want %q", got, c.vsWant)
			}
			if got := r.against(base(), steps); !holdsAll(got, c.vsRun) || len(c.vsRun) == 0 && len(got) != 0 {
				t.Errorf("differences between the runs %q, want %q", got, c.vsRun)
			}
		})
	}

	empty := expected(Want{Effects: map[string]any{"roles": map[string]any{}}})
	if d := (&run{effects: map[string]any{"roles": map[string]any{"a": "login"}}}).differences(empty, nil); !holdsAll(d, []string{`effect roles is {"a":"login"}, want it empty`}) {
		t.Errorf("an effect the story wants empty is not: differences %q", d)
	}
}

// holdsAll says each text in want is in one of got.
func holdsAll(got, want []string) bool {
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, w) }) {
			return false
		}
	}
	return true
}
