package bothways

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// run is what one replay came to, read for comparing.
type run struct {
	verdicts    []workertest.Verdict
	outcomes    []string
	outcomeData map[string][]any
	deadLetters []deadLetter
	state       map[string]any
	effects     map[string]any
}

type deadLetter struct {
	step   int
	reason string
}

// read reads what the replay of mode m came to.
func read(t *testing.T, m Mode, res *workertest.Result) *run {
	t.Helper()
	out := &run{verdicts: res.Verdicts(), outcomeData: map[string][]any{}, state: map[string]any{}}
	// A dead letter names its event by stream sequence; two steps of one
	// id stored once share one.
	stepOf := map[uint64]int{}
	for i, e := range res.Events {
		if _, dup := stepOf[e.Sequence]; !dup {
			stepOf[e.Sequence] = i
		}
	}
	for _, o := range res.Outcomes {
		name := o.Subject() + " " + workertest.OutcomeName(o)
		out.outcomes = append(out.outcomes, name)
		out.outcomeData[o.Subject()] = append(out.outcomeData[o.Subject()], supersededByLater(t, m, decode(t, m, o.Type(), o.Data())))
	}
	for _, d := range res.DeadLetters {
		step, ok := stepOf[d.Sequence]
		if !ok {
			step = -1
		}
		out.deadLetters = append(out.deadLetters, deadLetter{step: step, reason: d.Reason})
	}
	slices.SortStableFunc(out.deadLetters, func(a, b deadLetter) int { return a.step - b.step })
	for name, raw := range res.State {
		out.state[name] = decode(t, m, name, raw)
	}
	return out
}

func decode(t *testing.T, m Mode, name string, raw []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %s is not JSON: %v", m, name, err)
	}
	return v
}

// supersededByLater checks that a runtime superseded outcome
// (events.Superseded) names a later event as the one that superseded it,
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
	var s events.Superseded
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
	out := &run{verdicts: w.Verdicts, outcomes: w.Outcomes, state: asJSON(w.State), effects: asJSON(w.Effects)}
	for _, reason := range w.DeadLetters {
		out.deadLetters = append(out.deadLetters, deadLetter{step: -1, reason: reason})
	}
	return out
}

// differences lists how r falls short of want: an event's verdict, a key's
// outcomes, a dead letter's reason, a state document, an effect.
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
		out = append(out, shortOf("state document", r.state, want.state)...)
	}
	if want.effects != nil {
		out = append(out, shortOf("effect", r.effects, want.effects)...)
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
	out = append(out, documentDifferences("state document", m.state, rt.state)...)
	out = append(out, documentDifferences("effect", m.effects, rt.effects)...)
	return out
}

// shortOf lists how the documents got (of a kind: "state document")
// fall short of want: a document missing or not wanted, a field wanted with
// another value.
func shortOf(kind string, got, want map[string]any) []string {
	var out []string
	for _, n := range sortedNames(got, want) {
		g, inGot := got[n]
		w, inWant := want[n]
		switch {
		case !inGot:
			out = append(out, fmt.Sprintf("no %s %s, want one holding %s", kind, n, jsonText(w)))
			continue
		case !inWant:
			out = append(out, fmt.Sprintf("%s %s is %s, want none", kind, n, jsonText(g)))
			continue
		}
		gd, _ := g.(map[string]any)
		wd, ok := w.(map[string]any)
		if !ok || gd == nil {
			if !reflect.DeepEqual(g, w) {
				out = append(out, fmt.Sprintf("%s %s is %s, want %s", kind, n, jsonText(g), jsonText(w)))
			}
			continue
		}
		if len(wd) == 0 && len(gd) != 0 {
			out = append(out, fmt.Sprintf("%s %s is %s, want it empty", kind, n, jsonText(g)))
		}
		for _, f := range sortedNames(wd) {
			if !reflect.DeepEqual(gd[f], wd[f]) {
				out = append(out, fmt.Sprintf("%s %s has %s %s, want %s", kind, n, f, jsonText(gd[f]), jsonText(wd[f])))
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

// documentDifferences lists the documents (of a kind: "state document")
// in which the in-memory run m and the runtime's rt differ.
func documentDifferences(kind string, m, rt map[string]any) []string {
	var out []string
	for _, n := range sortedNames(m, rt) {
		a, inM := m[n]
		b, inRT := rt[n]
		if inM != inRT || !reflect.DeepEqual(a, b) {
			out = append(out, fmt.Sprintf("%s %s: %s %s, %s %s", kind, n, InMemory, docText(a, inM), OnRuntime, docText(b, inRT)))
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

// asJSON is m as JSON decodes it (numbers as float64, structs as maps), so
// what a story writes compares with what a run read; nil stays nil.
func asJSON(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	raw, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("bothways: %v does not encode: %v", m, err))
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		panic(fmt.Sprintf("bothways: %s does not decode: %v", raw, err))
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
