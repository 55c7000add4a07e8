package join_test

import (
	"context"
	"crypto"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// newKey makes another ed25519 key pair, <name>.key and <name>.pub, in the
// fixture's folder.
func (f *fixture) newKey(name string) crypto.Signer {
	f.t.Helper()
	if err := signing.GenerateKeyPair(signing.Ed25519, f.path(name+".key"), f.path(name+".pub")); err != nil {
		f.t.Fatal(err)
	}
	return f.loadKey(name + ".key")
}

// keySetFile concatenates the fixture's .pub files into one PEM file of
// several PUBLIC KEY blocks, as an operator writes a key set.
func (f *fixture) keySetFile(name string, pubs ...string) string {
	f.t.Helper()
	var set []byte
	for _, p := range pubs {
		set = append(set, readFile(f.t, f.path(p))...)
	}
	f.write(name, string(set), 0o644)
	return f.path(name)
}

// swapWorker is one join worker standing behind a Spec and a Handler that
// outlive it, so an in-memory Runner keeps the box's state while the
// worker is restarted with another configuration.
type swapWorker struct{ w *join.Worker }

func (s *swapWorker) Handle(ctx context.Context, d *workers.Delivery) error {
	return s.w.Handle(ctx, d)
}

func (s *swapWorker) spec() workers.Spec {
	spec := s.w.Spec()
	spec.Rank = func(ctx context.Context, d *workers.Delivery) (uint64, error) { return s.w.Spec().Rank(ctx, d) }
	return spec
}

// restart replaces the worker with one built from the fixture's config.
func (s *swapWorker) restart(f *fixture) {
	f.t.Helper()
	s.w = f.worker()
}

// invitationAt is the fixture's invitation for enrollment, issued at
// issued+hours, signed by key.
func (f *fixture) invitationAt(key crypto.Signer, enrollment string, hours int) events.InvitationWritten {
	f.t.Helper()
	inv := f.invitation()
	inv.Enrollment = enrollment
	inv.IssuedAt = issued.Add(time.Duration(hours) * time.Hour).Format(time.RFC3339)
	data, err := join.SignInvitation(key, inv)
	if err != nil {
		f.t.Fatal(err)
	}
	return data
}

// assertRefusedOutcome checks that res refused its one event with outcome
// and the rule named, in the outcome and in the handler's error.
func assertRefusedOutcome(t *testing.T, res *workertest.Result, outcome, rule string, wants ...string) {
	t.Helper()
	res.AssertVerdicts(workertest.Refused)
	res.AssertOutcomes(outcome)
	got := workertest.OutcomeAs[map[string]string](res, outcome)
	if got["rule"] != rule {
		t.Fatalf("%s outcome %v, want rule %s", outcome, got, rule)
	}
	for _, want := range append([]string{"[" + rule + "]"}, wants...) {
		if !strings.Contains(res.Err().Error(), want) {
			t.Errorf("refusal %q does not say %q", res.Err(), want)
		}
	}
}

// TestConsoleKeySetAcceptsEitherKey: with two console keys in
// --console-key (one PEM file of two PUBLIC KEY blocks), an invitation
// signed by either arms the box, and one signed by a third key is refused
// with the signature rule and arms nothing.
func TestConsoleKeySetAcceptsEitherKey(t *testing.T) {
	f := newFixture(t, "box-k")
	second := f.newKey("console2")
	stranger := f.newKey("stranger")
	f.cfg.ConsoleKey = f.keySetFile("consoles.pub", "console.pub", "console2.pub")
	w := f.worker()
	r := workertest.NewRunner(t, w.Spec(), w)
	r.WorkData(events.TypeHostFloorPublished, "dep", f.floor("1.0.0")).AssertOutcomes(join.OutcomeFloorAccepted)

	for i, key := range []crypto.Signer{f.console, second} {
		res := r.WorkData(events.TypeInvitationWritten, "box-k", f.invitationAt(key, "enr-"+string(rune('a'+i)), i))
		res.AssertVerdicts(workertest.Applied)
		res.AssertOutcomes(join.OutcomeArmed)
	}
	res := r.WorkData(events.TypeInvitationWritten, "box-k", f.invitationAt(stranger, "enr-x", 5))
	assertRefusedOutcome(t, res, join.OutcomeRefused, "signature", "does not verify with the console key set", "consoles.pub")
	if n := f.armRuns(); n != 2 {
		t.Fatalf("the arm command ran %d times, want 2 (once per key of the set)", n)
	}
}

// TestReleaseKeySetAcceptsEitherKey: with two release keys in
// --release-key (two files separated by commas), a floor signed by either
// is accepted, and one signed by a third key is refused with the signature
// rule and the floor kept before stays.
func TestReleaseKeySetAcceptsEitherKey(t *testing.T) {
	f := newFixture(t, "box-r")
	second := f.newKey("release2")
	stranger := f.newKey("stranger")
	f.cfg.ReleaseKey = f.path("release.pub") + "," + f.path("release2.pub")
	w := f.worker()
	r := workertest.NewRunner(t, w.Spec(), w)
	floor := func(key crypto.Signer, version string) events.HostFloorPublished {
		d, err := join.SignHostFloor(key, events.HostFloor{V: 1, Deployment: "dep", MinAgentVersion: version, Binaries: []string{strings.Repeat("ab", 32)}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	r.WorkData(events.TypeHostFloorPublished, "dep", floor(f.release, "1.0.0")).AssertOutcomes(join.OutcomeFloorAccepted)
	r.WorkData(events.TypeHostFloorPublished, "dep", floor(second, "1.1.0")).AssertOutcomes(join.OutcomeFloorAccepted)
	res := r.WorkData(events.TypeHostFloorPublished, "dep", floor(stranger, "2.0.0"))
	assertRefusedOutcome(t, res, join.OutcomeFloorRefused, "signature", "does not verify with the release key set", "release2.pub")

	// The floor kept is the second key's, and it is verified again, with
	// the set, when an invitation needs it.
	inv := r.WorkData(events.TypeInvitationWritten, "box-r", f.sign(f.invitation()))
	inv.AssertOutcomes(join.OutcomeArmed)
	var policy join.Policy
	if err := json.Unmarshal(readFile(t, join.PolicyPath(f.cfg.OptDir)), &policy); err != nil {
		t.Fatal(err)
	}
	if policy.Floor.MinAgentVersion != "1.1.0" {
		t.Fatalf("the policy holds floor %+v, want the second key's 1.1.0", policy.Floor)
	}
}

// TestConsoleKeyRotation is the rotation story: the box trusts the old
// console key only (the new key's invitation is refused); then both (an
// invitation by either arms it, the last one by the new key); then the new
// key only (the old key's invitation is refused, the new key's arms it,
// and the accepted invitation kept from the overlap, signed by the new
// key, still verifies). Each step is a restart with another
// --console-key, over the same state.
func TestConsoleKeyRotation(t *testing.T) {
	f := newFixture(t, "box-rot")
	oldKey := f.console
	newKey := f.newKey("console-new")
	f.cfg.ConsoleKey = f.path("console.pub")
	s := &swapWorker{}
	s.restart(f)
	r := workertest.NewRunner(t, s.spec(), s)
	r.WorkData(events.TypeHostFloorPublished, "dep", f.floor("1.0.0")).AssertOutcomes(join.OutcomeFloorAccepted)
	work := func(key crypto.Signer, enrollment string, hours int) *workertest.Result {
		t.Helper()
		return r.WorkData(events.TypeInvitationWritten, "box-rot", f.invitationAt(key, enrollment, hours))
	}
	armed := func(res *workertest.Result) {
		t.Helper()
		res.AssertVerdicts(workertest.Applied)
		res.AssertOutcomes(join.OutcomeArmed)
	}

	// The old key only.
	armed(work(oldKey, "enr-1", 0))
	assertRefusedOutcome(t, work(newKey, "enr-2", 1), join.OutcomeRefused, "signature")

	// Both keys: the new key's public half added to the set.
	f.cfg.ConsoleKey = f.path("console.pub") + "," + f.path("console-new.pub")
	s.restart(f)
	armed(work(oldKey, "enr-3", 2))
	armed(work(newKey, "enr-4", 3))

	// The new key only: the old one removed.
	f.cfg.ConsoleKey = f.path("console-new.pub")
	s.restart(f)
	assertRefusedOutcome(t, work(oldKey, "enr-5", 4), join.OutcomeRefused, "signature", "does not verify with the console key set")
	armed(work(newKey, "enr-6", 5))
	if n := f.armRuns(); n != 4 {
		t.Fatalf("the arm command ran %d times, want 4", n)
	}
	var enrollment join.Enrollment
	if err := json.Unmarshal(readFile(t, join.EnrollmentPath(f.cfg.OptDir)), &enrollment); err != nil {
		t.Fatal(err)
	}
	if enrollment.Enrollment != "enr-6" {
		t.Fatalf("enrollment.json holds %+v, want enr-6", enrollment)
	}
}

// TestKeySetFlags: a set given either way loads; an empty setting, a
// missing file among several, and a set with a key that is not ed25519
// are refused naming the flag.
func TestKeySetFlags(t *testing.T) {
	f := newFixture(t, "box-flags")
	f.newKey("console2")
	if err := signing.GenerateKeyPair(signing.P256, f.path("p256.key"), f.path("p256.pub")); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{
		f.keySetFile("set.pub", "console.pub", "console2.pub"),
		f.path("console.pub") + "," + f.path("console2.pub"),
	} {
		cfg := f.cfg
		cfg.ConsoleKey, cfg.ReleaseKey = spec, spec
		if _, err := join.New(cfg); err != nil {
			t.Fatalf("a set %s: %v", spec, err)
		}
	}
	for _, c := range []struct {
		change func(c *join.Config)
		flag   string
	}{
		{func(c *join.Config) { c.ConsoleKey = " , " }, "--console-key"},
		{func(c *join.Config) { c.ConsoleKey += "," + f.path("missing.pub") }, "--console-key"},
		{func(c *join.Config) { c.ReleaseKey = f.keySetFile("mixed.pub", "release.pub", "p256.pub") }, "--release-key"},
	} {
		cfg := f.cfg
		c.change(&cfg)
		if _, err := join.New(cfg); err == nil || !strings.HasPrefix(err.Error(), c.flag+":") {
			t.Errorf("New returned %v, want an error naming %s", err, c.flag)
		}
	}
}
