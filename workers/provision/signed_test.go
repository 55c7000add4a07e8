package provision

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// Issue 12: a machine's age recipient is public, so before grants were
// signed one unsigned grant with a huge generation took over a consumer's
// role and database with the attacker's password, revoked the others and
// pinned the machine: every later grant of the real controller was
// "stale". Each test here is one such attack.

func grantEvent(t *testing.T, g events.GrantChanged) event.Event {
	t.Helper()
	e, err := events.New(events.TypeGrantChanged, g.Machine, g)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func replayGrants(t *testing.T, w *Worker, list ...events.GrantChanged) *workertest.Result {
	t.Helper()
	var evs []event.Event
	for _, g := range list {
		evs = append(evs, grantEvent(t, g))
	}
	return workertest.Replay(t, evs, w.Spec(), w)
}

// unsigned is g without any envelope, as the attacker sends it.
func unsigned(g events.GrantChanged) events.GrantChanged {
	g.Envelope = nil
	return g
}

func refusedGrant(t *testing.T, r *workertest.Result, rule string, secrets ...string) Refused {
	t.Helper()
	ref := workertest.OutcomeAs[Refused](r, OutcomeRefused)
	if ref.Rule != rule || !strings.Contains(ref.Reason, "nothing was changed") || !strings.Contains(ref.Reason, "republish it signed") {
		t.Errorf("refused %+v; want rule %q, saying nothing was changed and to republish it signed", ref, rule)
	}
	for _, s := range secrets {
		if strings.Contains(ref.Reason, s) || (r.Err() != nil && strings.Contains(r.Err().Error(), s)) {
			t.Errorf("a password is in the refusal: %q", ref.Reason)
		}
	}
	return ref
}

// TestAttackUnsignedHugeGeneration is the attack on a machine:
// the generation 2^63-1 (the largest the worker takes), the existing
// consumer's role and database with the attacker's password, the other
// consumer left out so it would be revoked. It changes nothing,
// supersedes nothing queued with it, and the controller's next grant
// applies.
func TestAttackUnsignedHugeGeneration(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	apply(t, w, e.grant(1, giv{"a", e.db("a"), "p-real-a"}, giv{"b", e.db("b"), "p-real-b"}))
	before := e.markedRoles()

	forged := unsigned(e.grant(math.MaxInt64, giv{"a", e.db("a"), "p-attacker"}))
	// The real grant is queued ahead of the forged one: were the forged
	// generation ranked, the real one would be superseded unapplied.
	real := e.grant(2, giv{"a", e.db("a"), "p-real-a"}, giv{"b", e.db("b"), "p-real-b"})
	r := replayGrants(t, w, real, forged)
	r.AssertVerdicts(workertest.Applied, workertest.Refused)
	r.AssertOutcomes(OutcomeApplied, OutcomeRefused)
	r.AssertDeadLetters()
	ref := refusedGrant(t, r, signing.RuleUnsigned, "p-attacker")
	if !strings.Contains(ref.Reason, "generation 9223372036854775807 for machine "+testMachine+" is not signed by the controller") {
		t.Errorf("reason %q does not say which grant is unsigned", ref.Reason)
	}
	after := e.markedRoles()
	for name, st := range before {
		if after[name] != st {
			t.Errorf("role %s changed: %+v, was %+v", name, after[name], st)
		}
	}

	// Not pinned: the controller's generation 3 applies.
	next := replayGrants(t, w, e.grant(3, giv{"a", e.db("a"), "p-real-a3"}))
	next.AssertVerdicts(workertest.Applied)
	if got := workertest.OutcomeAs[Applied](next, OutcomeApplied); got.Generation != 3 {
		t.Fatalf("applied %+v; the forged generation pinned the machine", got)
	}
}

// TestAttackForgedSignatureHugeGeneration signs the attacker's grant with
// the attacker's own key.
func TestAttackForgedSignatureHugeGeneration(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	dir := t.TempDir()
	atk, atkPub := filepath.Join(dir, "attacker.key"), filepath.Join(dir, "attacker.pub")
	if err := signing.GenerateKeyPair(signing.Ed25519, atk, atkPub); err != nil {
		t.Fatal(err)
	}
	forged := signGrantWith(t, atk, unsigned(e.grant(math.MaxInt64, giv{"a", e.db("a"), "p-attacker"})))
	r := replayGrants(t, w, forged, e.grant(1, giv{"a", e.db("a"), "p-real"}))
	r.AssertVerdicts(workertest.Refused, workertest.Applied)
	refusedGrant(t, r, signing.RuleSignature, "p-attacker")
	if got := workertest.OutcomeAs[Applied](r, OutcomeApplied); got.Generation != 1 {
		t.Fatalf("applied %+v, want the controller's generation 1", got)
	}
}

// TestAttackFieldsSwappedUnderARealSignature keeps the controller's
// envelope of generation 2 and changes what it vouches for. Nothing is
// changed on the server for any of them.
func TestAttackFieldsSwappedUnderARealSignature(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	apply(t, w, e.grant(1, giv{"a", e.db("a"), "p-real-a"}, giv{"b", e.db("b"), "p-real-b"}))
	before := e.markedRoles()
	real := e.grant(2, giv{"a", e.db("a"), "p-real-a"}, giv{"b", e.db("b"), "p-real-b"})
	attacker := e.encrypt("p-attacker")
	cases := map[string]func(g *events.GrantChanged){
		"huge generation":   func(g *events.GrantChanged) { g.Generation = math.MaxInt64 },
		"attacker password": func(g *events.GrantChanged) { g.Given[0].Secret = attacker },
		"consumer dropped":  func(g *events.GrantChanged) { g.Given = g.Given[:1] },
		"consumer added": func(g *events.GrantChanged) {
			g.Given = append(g.Given, events.Given{From: "x", Node: "x", Values: events.GivenValues{Name: e.db("x")}, Secret: attacker})
		},
		"node renamed":      func(g *events.GrantChanged) { g.Given[1].Node = "c" },
		"database renamed":  func(g *events.GrantChanged) { g.Given[1].Values.Name = e.db("c") },
		"consumers swapped": func(g *events.GrantChanged) { g.Given[0], g.Given[1] = g.Given[1], g.Given[0] },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			g := real
			g.Given = append([]events.Given(nil), real.Given...)
			mutate(&g)
			err, emitted := handleAsIs(t, w, g)
			var r *refusal
			if !asRefusal(err, &r) || r.Rule != signing.RuleBinding || len(emitted) != 1 {
				t.Fatalf("got %v (%d outcomes); want a refusal by rule %s", err, len(emitted), signing.RuleBinding)
			}
			if strings.Contains(err.Error(), "p-attacker") || strings.Contains(err.Error(), "p-real") {
				t.Fatal("a password is in the refusal")
			}
		})
	}
	after := e.markedRoles()
	for n, st := range before {
		if after[n] != st {
			t.Errorf("role %s changed", n)
		}
	}
	if err, _ := handleAsIs(t, w, real); err != nil {
		t.Fatalf("the genuine generation 2: %v", err)
	}
}

// TestResetAfterASignedMistakeGeneration: the controller itself signed
// the generation 2^63-1 by mistake, so every later grant is stale. The
// documented reset (delete the machine's row of
// steward.provision_generation) lets the controller's current, lower
// generation apply again, in full.
func TestResetAfterASignedMistakeGeneration(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	apply(t, w, e.grant(math.MaxInt64, giv{"a", e.db("a"), "p-mistake"}))
	r := replayGrants(t, w, e.grant(3, giv{"a", e.db("a"), "p-3"}, giv{"b", e.db("b"), "p-b"}))
	r.AssertOutcomes(OutcomeSkipped)

	// The reset as the README gives it (with this test's prefix).
	if _, err := e.admin.Exec(context.Background(), `DELETE FROM steward.provision_generation WHERE machine = $1 AND prefix = $2`, testMachine, e.prefix); err != nil {
		t.Fatal(err)
	}
	r = replayGrants(t, w, e.grant(3, giv{"a", e.db("a"), "p-3"}, giv{"b", e.db("b"), "p-b"}))
	r.AssertVerdicts(workertest.Applied)
	got := workertest.OutcomeAs[Applied](r, OutcomeApplied)
	if got.Generation != 3 || len(got.Altered.Roles) != 1 || len(got.Created.Roles) != 1 {
		t.Fatalf("applied %+v after the reset; want generation 3, a's password altered and b created", got)
	}
	r = replayGrants(t, w, e.grant(2, giv{"a", e.db("a"), "p-2"}))
	r.AssertOutcomes(OutcomeSkipped)
}

// TestUnsignedGrantRefusedByTheHandlerToo: the handler refuses what Rank
// does, whichever sees it first. Queued behind a signed grant, an
// unsigned one with a higher generation must not rank, or it would
// supersede the signed one and never be applied itself: the attack of a
// publisher without the controller's key. Both run unchecked, so the
// schema does not stop the unsigned one first.
func TestUnsignedGrantRefusedByTheHandlerToo(t *testing.T) {
	e := newEnv(t)
	w := e.worker(nil)
	signed := grantEvent(t, e.grant(1, giv{"a", e.db("a"), "p"}))
	forged := grantEvent(t, unsigned(e.grant(2, giv{"a", e.db("a"), "forged"})))
	res := workertest.NewRunner(t, w.Spec(), w).WorkAll([]event.Event{signed, forged}, workertest.Unchecked())
	res.AssertVerdicts(workertest.Applied, workertest.Refused)
	var r *refusal
	if !asRefusal(res.Events[1].Err, &r) || r.Rule != signing.RuleUnsigned {
		t.Fatalf("got %v, want a refusal by rule unsigned", res.Events[1].Err)
	}

	e2 := newEnv(t)
	w2 := e2.worker(nil)
	err, emitted := handleAsIs(t, w2, unsigned(e2.grant(1, giv{"a", e2.db("a"), "p"})))
	if !asRefusal(err, &r) || r.Rule != signing.RuleUnsigned || len(emitted) != 1 {
		t.Fatalf("got %v, want a refusal by rule unsigned", err)
	}
	if len(e2.markedRoles()) != 0 {
		t.Fatal("an unsigned grant created a role")
	}
}

func asRefusal(err error, r **refusal) bool { return errors.As(err, r) }
