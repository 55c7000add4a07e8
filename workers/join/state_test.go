package join_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// forgeState overwrites one of the worker's state documents, as anyone who
// can write the checkpoint bucket can.
func forgeState(t *testing.T, r *workertest.Running, name string, doc any) {
	t.Helper()
	var current json.RawMessage
	rev, err := r.State().Get(context.Background(), name, &current)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.State().Put(context.Background(), name, doc, rev); err != nil {
		t.Fatal(err)
	}
}

// evilFloor is the floor an attacker would like the guard to hold: an old
// agent allowed, and their own binary.
var evilFloor = events.HostFloor{V: 1, Deployment: "dep", MinAgentVersion: "0.0.1", Binaries: []string{strings.Repeat("ee", 32)}}

// forgedFloors are kept-floor documents nobody signed, each with the
// readable copy ("floor") the worker used to trust.
func forgedFloors(t *testing.T, f *fixture, evil events.HostFloor) map[string]any {
	t.Helper()
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	strangers, err := join.SignHostFloor(stranger, evil)
	if err != nil {
		t.Fatal(err)
	}
	swapped := f.floor("1.0.0").Envelope
	raw, _ := json.Marshal(evil)
	swapped.Payload = base64.StdEncoding.EncodeToString(raw)
	return map[string]any{
		// Exactly what the worker wrote before floors were kept as
		// evidence, which anyone can write too.
		"written without evidence": map[string]any{"floor": evil, "eventId": "forged", "sequence": 1},
		"signed by another key":    map[string]any{"floor": evil, "envelope": strangers.Envelope, "eventId": "forged", "sequence": 1},
		"payload swapped under the release key's signature": map[string]any{
			"floor": evil, "envelope": swapped, "eventId": "forged", "sequence": 1,
		},
	}
}

// TestForgedKeptFloorIsRefused writes a floor nobody signed into the
// worker's state and sends a valid invitation: it is refused, naming the
// floor found and how to recover, and nothing is written or armed (the
// worker used to arm the guard with the forged floor). Republishing the
// floor, as the refusal says, replaces the forgery, and the invitation
// published again arms with the verified floor.
func TestForgedKeptFloorIsRefused(t *testing.T) {
	for name := range forgedFloors(t, newFixture(t, "box-k"), evilFloor) {
		t.Run(name, func(t *testing.T) {
			srv := workertest.StartServer(t)
			js := srv.JetStream(t)
			f := newFixture(t, "box-k")
			doc := forgedFloors(t, f, evilFloor)[name]
			h, r := f.startRecording(js)
			f.publishFloor(js, f.floor("1.0.0"))
			waitOutcomes(t, js, "box-k", join.OutcomeFloorAccepted, 1)
			forgeState(t, r, "floor", doc)

			ack := f.publishInvitation(js, f.sign(f.invitation()))
			refused := waitOutcomes(t, js, "box-k", join.OutcomeRefused, 1)
			workertest.WaitIdle(t, js, r.ConsumerName())
			assertNoDeadLetters(t, js, "box-k")
			assertRefused(t, h, ack, "box-k", "[kept-floor]", "the kept host floor of box box-k", "the guard was not armed")
			reason := refused[0]["reason"]
			for _, want := range []string{
				"taken neither as the floor of deployment dep nor as no floor",
				"Republish the deployment's newest host floor (steward publish --type " + events.TypeHostFloorPublished,
				"then publish this invitation again",
			} {
				if refused[0]["rule"] != "kept-floor" || !strings.Contains(reason, want) {
					t.Errorf("refused outcome %v does not say %q", refused[0], want)
				}
			}
			f.assertOptEmpty()
			if n := f.armRuns(); n != 0 {
				t.Fatalf("the arm command ran %d times on a forged floor", n)
			}

			// The recovery the refusal names.
			f.publishFloor(js, f.floor("1.0.0"))
			accepted := waitOutcomes(t, js, "box-k", join.OutcomeFloorAccepted, 2)
			if !strings.Contains(accepted[1]["replaced"], "the kept host floor of box box-k") {
				t.Errorf("floor-accepted %v does not say it replaced a floor that does not verify", accepted[1])
			}
			f.publishInvitation(js, f.sign(f.invitation()))
			waitOutcomes(t, js, "box-k", join.OutcomeArmed, 1)
			var policy join.Policy
			if err := json.Unmarshal(readFile(t, join.PolicyPath(f.cfg.OptDir)), &policy); err != nil {
				t.Fatal(err)
			}
			if policy.Floor.MinAgentVersion != "1.0.0" || policy.Floor.Binaries[0] != strings.Repeat("ab", 32) {
				t.Fatalf("policy.json holds floor %+v, want the verified 1.0.0", policy.Floor)
			}
		})
	}
}

// TestForgedKeptFloorCannotFreezeTheFloor writes a forged floor claiming a
// far newer version: a real, newer floor still replaces it (the worker used
// to keep the forgery, as "not newer", for ever).
func TestForgedKeptFloorCannotFreezeTheFloor(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-z")
	_, r := f.start(js)
	f.publishFloor(js, f.floor("1.0.0"))
	waitOutcomes(t, js, "box-z", join.OutcomeFloorAccepted, 1)
	frozen := evilFloor
	frozen.MinAgentVersion = "99.0.0"
	forgeState(t, r, "floor", forgedFloors(t, f, frozen)["signed by another key"])

	f.publishFloor(js, f.floor("1.1.0"))
	accepted := waitOutcomes(t, js, "box-z", join.OutcomeFloorAccepted, 2)
	workertest.WaitIdle(t, js, r.ConsumerName())
	if accepted[1]["minAgentVersion"] != "1.1.0" || !strings.Contains(accepted[1]["replaced"], "does not verify [signature]") {
		t.Fatalf("floor-accepted %v, want 1.1.0 replacing a floor that does not verify", accepted[1])
	}
	if got := outcomes(t, js, "box-z", join.OutcomeFloorKept); len(got) != 0 {
		t.Fatalf("the forged floor was kept: %v", got)
	}
	if kept := stateFloor(t, r); kept.Floor.MinAgentVersion != "1.1.0" {
		t.Fatalf("kept floor %+v, want 1.1.0", kept.Floor)
	}
	// The replaced floor is verified evidence again: an older one is
	// compared with it and kept out.
	f.publishFloor(js, f.floor("1.0.5"))
	waitOutcomes(t, js, "box-z", join.OutcomeFloorKept, 1)
	assertNoDeadLetters(t, js, "box-z")
}

// forgedOrders are invitation-order documents nobody signed, each claiming
// an invitation from far in the future, so that every real invitation
// would look superseded.
func forgedOrders(t *testing.T, f *fixture) map[string]any {
	t.Helper()
	future := f.invitation()
	future.Enrollment = "enr-forged"
	future.IssuedAt = "2999-01-01T00:00:00Z"
	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	strangers, err := join.SignInvitation(stranger, future)
	if err != nil {
		t.Fatal(err)
	}
	copyOf := func(env *dsse.Envelope) map[string]any {
		doc := map[string]any{"enrollment": future.Enrollment, "issuedAt": future.IssuedAt, "eventId": "forged", "sequence": 1}
		if env != nil {
			doc["envelope"] = env
		}
		return doc
	}
	// A real console signature over a time a day ahead: an invitation the
	// worker would have refused, copied into the bucket.
	ahead := future
	ahead.IssuedAt = time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	consoles := f.sign(ahead)
	return map[string]any{
		"written without evidence": copyOf(nil),
		"signed by another key":    copyOf(&strangers.Envelope),
		// No comma in a subtest name: t.TempDir() would put it in the key
		// path, and --console-key reads a comma as two files.
		"signed by the console from the future": copyOf(&consoles.Envelope),
	}
}

// TestForgedInvitationOrderIsRefused writes a forged invitation order into
// the worker's state and sends a newer, valid invitation: it is refused,
// naming the document found and the command that recovers (the worker used
// to call every real invitation superseded). Running that command and
// publishing the invitation again re-arms the box, and the order is kept
// as evidence again.
func TestForgedInvitationOrderIsRefused(t *testing.T) {
	for name := range forgedOrders(t, newFixture(t, "box-o")) {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, "box-o")
			testForgedOrder(t, f, forgedOrders(t, f)[name])
		})
	}
}

func testForgedOrder(t *testing.T, f *fixture, doc any) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h, r := f.startRecording(js)
	f.publishFloor(js, f.floor("1.0.0"))
	first := f.sign(f.invitation())
	f.publishInvitation(js, first)
	waitOutcomes(t, js, "box-o", join.OutcomeArmed, 1)
	forgeState(t, r, "invitation", doc)

	next := f.invitation()
	next.Enrollment = "enr-2"
	next.IssuedAt = issued.Add(time.Hour).Format(time.RFC3339)
	ack := f.publishInvitation(js, f.sign(next))
	refused := waitOutcomes(t, js, "box-o", join.OutcomeRefused, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	assertNoDeadLetters(t, js, "box-o")
	assertRefused(t, h, ack, "box-o", "[kept-invitation]", "the newest accepted invitation of box box-o", "the guard was not armed")
	recovery := "nats kv del " + events.CheckpointBucket + " st.join.box-o.invitation"
	if refused[0]["rule"] != "kept-invitation" || !strings.Contains(refused[0]["reason"], recovery) {
		t.Fatalf("refused outcome %v, want rule kept-invitation naming %q", refused[0], recovery)
	}
	if got := outcomes(t, js, "box-o", join.OutcomeSuperseded); len(got) != 0 {
		t.Fatalf("a forged order superseded a real invitation: %v", got)
	}
	if n := f.armRuns(); n != 1 {
		t.Fatalf("the arm command ran %d times, want 1", n)
	}

	// The recovery the refusal names: that key, deleted; the invitation,
	// published again.
	kv, err := js.KeyValue(context.Background(), events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), strings.Fields(recovery)[4]); err != nil {
		t.Fatal(err)
	}
	f.publishInvitation(js, f.sign(next))
	armed := waitOutcomes(t, js, "box-o", join.OutcomeArmed, 2)
	if armed[1]["enrollment"] != "enr-2" {
		t.Fatalf("armed %v, want enr-2", armed[1])
	}
	// The order written now is evidence: the first invitation is older.
	older := f.publishInvitation(js, first)
	waitOutcomes(t, js, "box-o", join.OutcomeSuperseded, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	assertRefused(t, h, older, "box-o", "is superseded by the accepted one for enrollment enr-2")
	assertNoDeadLetters(t, js, "box-o")
}
