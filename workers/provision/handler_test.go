package provision

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestHandlerEndToEnd runs the worker on the real embedded NATS: a grant
// is applied and reported; then an attacker's inputs (another machine's
// grant on this machine's subject, a wrong requirement, a missing secret,
// a secret encrypted to someone else, a damaged secret, an overlong
// database name, a stale generation) are refused or skipped, each on its
// first delivery, with nothing changed and no password in any outcome or
// dead letter; a refusal gives grant.refused and no dead letter; finally a
// valid newer grant still applies.
func TestHandlerEndToEnd(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	e := newEnv(t)
	w := e.worker(nil)
	run := workertest.Start(t, js, w.Spec(), w)

	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, e.grant(1, giv{"a", e.db("a"), "p-first"}))
	workertest.WaitIdle(t, js, run.ConsumerName())
	outs := workertest.Outcomes(t, js, Name, testMachine)
	if len(outs) != 1 {
		t.Fatalf("outcomes %v, want one applied", types(outs))
	}
	applied := workertest.DataAs[Applied](t, outs[0], typeApplied)
	assertNames(t, "created roles", applied.Created.Roles, []string{e.role("a")})
	assertNames(t, "created databases", applied.Created.Databases, []string{e.db("a")})
	if applied.Generation != 1 || applied.Machine != testMachine {
		t.Fatalf("applied %+v", applied)
	}
	before := e.markedRoles()

	// The attacker's inputs.
	attackerPasswords := []string{"p-attack-1", "p-attack-2", "p-attack-3", "p-attack-4"}
	other := e.grant(2, giv{"a", e.db("a"), attackerPasswords[0]})
	other.Machine = "other"
	other = signGrant(t, other)
	publishRaw(t, js, "steward.events.grant.changed."+testMachine, "other", other)
	wrongReq := e.grant(2, giv{"a", e.db("a"), attackerPasswords[0]})
	wrongReq.Requirement = "mysql"
	wrongReq = signGrant(t, wrongReq)
	publishRaw(t, js, "steward.events.grant.changed."+testMachine, testMachine, wrongReq)

	missing := e.grant(2, giv{"a", e.db("a"), attackerPasswords[1]}, giv{"b", e.db("b"), "unused"})
	missing.Given[1].Secret = ""
	missing = signGrant(t, missing)
	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, missing)

	foreign := e.grant(2, giv{"a", e.db("a"), attackerPasswords[2]}, giv{"b", e.db("b"), "unused"})
	foreign.Given[1].Secret = encryptTo(t, mustRecipient(t), attackerPasswords[3])
	foreign = signGrant(t, foreign)
	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, foreign)

	damaged := e.grant(2, giv{"a", e.db("a"), attackerPasswords[2]}, giv{"b", e.db("b"), "unused"})
	damaged.Given[1].Secret = "-----BEGIN AGE ENCRYPTED FILE-----\nbm90IGFnZQ==\n-----END AGE ENCRYPTED FILE-----\n"
	damaged = signGrant(t, damaged)
	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, damaged)

	long := e.grant(2, giv{"a", e.db("a"), attackerPasswords[2]}, giv{"b", strings.Repeat("d", 64), "unused"})
	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, long)

	stale := e.grant(1, giv{"a", e.db("a"), attackerPasswords[2]})
	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, stale)
	workertest.WaitIdle(t, js, run.ConsumerName())

	outs = workertest.Outcomes(t, js, Name, testMachine)[1:]
	wantRules := []string{"secret-missing", "secret-undecryptable", "secret-undecryptable", "database-name-length"}
	if len(outs) != len(wantRules)+1 {
		t.Fatalf("outcomes after the attack: %v", types(outs))
	}
	for i, rule := range wantRules {
		if r := workertest.DataAs[Refused](t, outs[i], typeRefused); r.Rule != rule || r.Consumer != "b" || r.Generation != 2 {
			t.Errorf("outcome %d: %s, want refused by %s for consumer b", i, outs[i].Data(), rule)
		}
	}
	if skipped := workertest.DataAs[Skipped](t, outs[len(outs)-1], typeSkipped); skipped.Applied != 1 || skipped.Generation != 1 {
		t.Errorf("last outcome %+v, want skipped generation 1 below applied 1", skipped)
	}
	// A refusal is settled with its outcome, never a dead letter: only the
	// two events the runtime finds invalid are dead-lettered.
	dls := workertest.DeadLetters(t, js, Name, testMachine)
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2 (other machine, requirement); refusals are never dead letters: %+v", len(dls), dls)
	}
	// Invalid events go to the DLQ off the key's lane, so in any order.
	for _, dl := range dls {
		if !strings.Contains(dl.Reason, "does not end in the event's key") && !strings.Contains(dl.Reason, "/requirement") {
			t.Errorf("dead letter reason %q does not say why the event is invalid", dl.Reason)
		}
		if dl.Delivered != 1 {
			t.Errorf("dead letter %q took %d deliveries; an invalid event is dead-lettered at once", dl.Reason, dl.Delivered)
		}
	}
	for _, pw := range attackerPasswords {
		for _, o := range workertest.Outcomes(t, js, Name, testMachine) {
			if strings.Contains(string(o.Data()), pw) {
				t.Fatalf("outcome %s holds a password", o.Type())
			}
		}
		for _, dl := range dls {
			if strings.Contains(dl.Reason, pw) {
				t.Fatal("a dead letter's reason holds a password")
			}
		}
	}
	after := e.markedRoles()
	if len(after) != len(before) || after[e.role("a")] != before[e.role("a")] || !verifierMatches(after[e.role("a")].verifier, "p-first") {
		t.Fatalf("the attack changed the roles: %v, were %v", after, before)
	}
	if e.dbOwner(e.db("b")) != "" || e.appliedGeneration() != 1 {
		t.Fatal("the attack created a database or moved the generation")
	}

	// A valid newer grant still applies.
	workertest.PublishData(t, js, events.TypeGrantChanged, testMachine, e.grant(3, giv{"a", e.db("a"), "p-third"}, giv{"b", e.db("b"), "p-b"}))
	workertest.WaitIdle(t, js, run.ConsumerName())
	all := workertest.Outcomes(t, js, Name, testMachine)
	applied = workertest.DataAs[Applied](t, all[len(all)-1], typeApplied)
	assertNames(t, "altered roles", applied.Altered.Roles, []string{e.role("a")})
	assertNames(t, "created roles", applied.Created.Roles, []string{e.role("b")})
}

// TestHandleRefusesAnotherMachine drives the handler with what the runtime
// normally stops first, a grant for another machine or requirement, and
// checks it refuses and reports by itself.
func TestHandleRefusesAnotherMachine(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	for _, c := range []struct {
		rule  string
		patch func(*events.GrantChanged)
	}{
		{"machine", func(g *events.GrantChanged) { g.Machine = "other" }},
		{"requirement", func(g *events.GrantChanged) { g.Requirement = "mysql" }},
		{"generation", func(g *events.GrantChanged) { g.Generation = 1 << 63 }},
	} {
		g := e.grant(1, giv{"a", e.db("a"), "p"})
		c.patch(&g)
		err, emitted := handleUnchecked(t, w, g)
		var r *refusal
		if !errors.As(err, &r) || r.Rule != c.rule || !workers.IsRefused(err) {
			t.Fatalf("%s: got %v", c.rule, err)
		}
		if len(emitted) != 1 {
			t.Fatalf("%s: emitted %v, want one refused outcome", c.rule, types(emitted))
		}
		if got := workertest.DataAs[Refused](t, emitted[0], typeRefused); got.Rule != c.rule || got.Machine != testMachine || got.Reason == "" {
			t.Fatalf("%s: emitted %+v", c.rule, got)
		}
		if len(e.markedRoles()) != 0 {
			t.Fatalf("%s: roles were created", c.rule)
		}
	}
}

// handleUnchecked runs Handle on one grant through a Delivery in memory
// (workertest.Unchecked: the runtime's validation skipped), so a grant the runtime's
// validation stops first (another machine, another requirement) still
// reaches the handler's own checks. It returns the handler's error and the
// outcomes it emitted. Grants the runtime would let through go through
// workertest.Work instead. g is signed by the test controller first, so
// each case reaches the check it is about; handleAsIs does not sign.
func handleUnchecked(t testing.TB, w *Worker, g events.GrantChanged) (error, []event.Event) {
	t.Helper()
	return handleAsIs(t, w, signGrant(t, g))
}

// handleAsIs is handleUnchecked with g as it is given, envelope or none.
func handleAsIs(t testing.TB, w *Worker, g events.GrantChanged) (error, []event.Event) {
	t.Helper()
	raw, err := json.Marshal(g)
	if err != nil {
		t.Fatal(err)
	}
	ev := event.New()
	ev.SetID("grant-" + randomHex(8))
	ev.SetSource("/test")
	ev.SetType(events.TypeGrantChanged)
	ev.SetSubject(testMachine)
	if err := ev.SetData(events.ContentTypeJSON, raw); err != nil {
		t.Fatal(err)
	}
	res := workertest.Work(t, w.Spec(), w, ev, workertest.Unchecked())
	return res.Events[0].Err, res.Outcomes
}

// TestStaleGenerationIsSkippedInMemory runs two grants through the handler
// with workertest, no NATS server: the second, older one is skipped.
func TestStaleGenerationIsSkippedInMemory(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	r := workertest.NewRunner(t, w.Spec(), w)
	first := r.WorkData(events.TypeGrantChanged, testMachine, e.grant(2, giv{"a", e.db("a"), "p-2"}))
	first.AssertVerdicts(workertest.Applied)
	first.AssertOutcomes(OutcomeApplied)
	assertNames(t, "created roles", workertest.OutcomeAs[Applied](first, OutcomeApplied).Created.Roles, []string{e.role("a")})

	stale := r.WorkData(events.TypeGrantChanged, testMachine, e.grant(1, giv{"a", e.db("a"), "p-1"}))
	stale.AssertVerdicts(workertest.Applied)
	if sk := workertest.OutcomeAs[Skipped](stale, OutcomeSkipped); sk.Applied != 2 || sk.Generation != 1 {
		t.Fatalf("skipped %+v", sk)
	}
	stale.AssertDeadLetters()
}

// publishRaw publishes an event as an attacker would, straight to a
// subject, past the publisher's validation.
func publishRaw(t *testing.T, js jetstream.JetStream, subject, key string, data any) {
	t.Helper()
	ev := event.New()
	ev.SetID("attack-" + randomHex(8))
	ev.SetSource("/attacker")
	ev.SetType(events.TypeGrantChanged)
	ev.SetSubject(key)
	raw, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.SetData(events.ContentTypeJSON, raw); err != nil {
		t.Fatal(err)
	}
	msg, err := events.Encode(subject, ev)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// The outcome types, as the runtime publishes them.
var (
	typeApplied = events.OutcomeType(OutcomeNoun, OutcomeApplied)
	typeRefused = events.OutcomeType(OutcomeNoun, OutcomeRefused)
	typeSkipped = events.OutcomeType(OutcomeNoun, OutcomeSkipped)
)

func types(list []event.Event) []string {
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.Type()
	}
	return out
}

var _ workers.Handler = (*Worker)(nil)
