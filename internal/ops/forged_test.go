package ops_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// The attack these tests play (docs/design.md §7): an identity on the bus
// lands messages on another instance's outcome and DLQ subjects, by a
// publish (where permissions would let it, or on an open bus), with a
// proof made by its own key, or by reflection: a direct get of a key it
// may read, whose reply subject is the victim's, answered by JetStream
// from inside the account and stored by STEWARD_OUTCOMES or STEWARD_DLQ.
// Each must be shown as forged, and the instance's own as fact.

const (
	victim   = "h1"
	attacker = "credential-h9"
)

// forgedOutcome is an outcome as the victim would emit it, saying the
// event causedBy applied.
func forgedOutcome(t *testing.T, id, causedBy string) event.Event {
	t.Helper()
	e := event.New()
	e.SetID(id)
	e.SetType(events.OutcomeType("credential", "applied"))
	e.SetSource("/steward/credential/" + victim)
	e.SetSubject(victim)
	e.SetTime(time.Now().UTC())
	e.SetExtension("causationid", causedBy)
	if err := e.SetData(events.ContentTypeJSON, map[string]any{"version": 2}); err != nil {
		t.Fatal(err)
	}
	return e
}

// encodeOn is e on subject, signed by s for signedFor when s is not nil.
func encodeOn(t *testing.T, subject string, e event.Event, s *proof.Signer, signedFor string) *nats.Msg {
	t.Helper()
	msg, err := events.Encode(subject, e)
	if err != nil {
		t.Fatal(err)
	}
	if s != nil {
		signed := nats.NewMsg(signedFor)
		signed.Header = msg.Header
		events.SignMessage(signed, events.StreamOutcomes, "", s, events.OutcomeProofContent(e))
	}
	return msg
}

// forgedLetter is a dead letter of a rotation of the victim's hive, as the
// runtime builds one, signed by s (nil: unsigned) as if stored on dlqOf.
func forgedLetter(t *testing.T, id string, s *proof.Signer, dlqOf string) *nats.Msg {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, victim, rotation(victim, 7))
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(id)
	orig, err := events.Encode(events.EventsPrefix+".credential.rotated."+victim, e)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := events.NewDeadLetter(events.LetterSource{
		Consumer: ops.ConsumerName("credential", victim), DLQSubject: dlqOf,
		Stream: events.StreamEvents, Sequence: 99, Subject: orig.Subject, Delivered: 1, Reason: "forged: the hive's folder is gone",
		Header: orig.Header, Data: orig.Data, Signer: s,
	})
	msg.Subject = events.DLQSubject("credential", victim)
	return msg
}

// reflect has JetStream store msg's headers and data on target without
// publishing there: the attacker writes them under a key of its own in
// the checkpoint bucket (which it may), then asks for a direct get of
// that key with target as the reply subject.
func reflect(t *testing.T, nc *nats.Conn, key, target string, msg *nats.Msg) {
	t.Helper()
	own := nats.NewMsg("$KV." + events.CheckpointBucket + "." + key)
	own.Header, own.Data = msg.Header, msg.Data
	// Stored before it is asked for: a direct get that comes first
	// answers "no message" to target, and nothing is reflected.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(context.Background(), own); err != nil {
		t.Fatal(err)
	}
	api := "$JS.API.DIRECT.GET.KV_" + events.CheckpointBucket + "." + own.Subject
	if err := nc.PublishRequest(api, target, nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// runVictim runs the victim instance with its real runtime and test keys:
// version 1 is applied (an outcome), version 2 dead-lettered. It returns
// the dead-lettered event's id once both are settled.
func runVictim(t *testing.T, js jetstream.JetStream) (dead string) {
	t.Helper()
	publishTraced(t, js, victim, 1, "")
	dead = publishTraced(t, js, victim, 2, "")
	w := workertest.Start(t, js, credSpec(victim), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		var r events.CredentialRotated
		if err := d.DataAs(&r); err != nil {
			return err
		}
		if r.Version == 2 {
			return workers.Permanent(errors.New("the hive's folder is gone"))
		}
		return d.Emit(ctx, "applied", map[string]any{"version": r.Version})
	}))
	workertest.WaitIdle(t, js, w.ConsumerName())
	workertest.WaitUntil(t, "the dead letter is stored", func() bool { return len(workertest.DeadLetters(t, js, "credential", victim)) == 1 })
	return dead
}

// TestForgedOutcomesAndLettersAreMarkedInHistory plays every way of
// landing an outcome or a dead letter on the victim's subjects and proves
// GetHistory marks each forged with why, while the runtime's own verify;
// without keys all are unverified and none forged.
func TestForgedOutcomesAndLettersAreMarkedInHistory(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	nc := srv.Connect(t)
	ctx := context.Background()
	dead := runVictim(t, js)

	outcomes := events.OutcomeSubject("credential", victim)
	dlq := events.DLQSubject("credential", victim)
	publish := func(msg *nats.Msg, stream string) {
		t.Helper()
		if _, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(stream)); err != nil {
			t.Fatal(err)
		}
	}
	// (a) No proof at all: the dead-lettered event "applied" after all.
	publish(encodeOn(t, outcomes, forgedOutcome(t, "forged-unsigned", dead), nil, ""), events.StreamOutcomes)
	// (b) Signed by another instance, for the victim's subject.
	publish(encodeOn(t, outcomes, forgedOutcome(t, "forged-other-instance", dead), workertest.Signer(attacker), outcomes), events.StreamOutcomes)
	// (b') Claiming to be the victim, signed with a key that is not its.
	impostor := proof.NewSigner(workertest.DocumentKey(attacker), "credential-"+victim, "")
	publish(encodeOn(t, outcomes, forgedOutcome(t, "forged-impostor", dead), impostor, outcomes), events.StreamOutcomes)
	// (c) Reflected: the attacker's own genuinely signed outcome, for its
	// own subject, stored on the victim's by a direct get.
	reflect(t, nc, "st.credential.h9.outcome", outcomes,
		encodeOn(t, outcomes, forgedOutcome(t, "forged-reflected", dead), workertest.Signer(attacker), events.OutcomeSubject("credential", "h9")))
	// The same three for dead letters.
	publish(forgedLetter(t, "letter-unsigned", nil, dlq), events.StreamDLQ)
	publish(forgedLetter(t, "letter-other-instance", workertest.Signer(attacker), dlq), events.StreamDLQ)
	reflect(t, nc, "st.credential.h9.letter", dlq, forgedLetter(t, "letter-reflected", workertest.Signer(attacker), events.DLQSubject("credential", "h9")))

	keys := ops.Proofs{Verifier: workertest.Verifier()}
	var h *ops.History
	workertest.WaitUntil(t, "both reflected messages are stored", func() bool {
		var err error
		h, err = ops.GetHistory(ctx, js, ops.HistoryOptions{Worker: "credential", Key: victim, Proofs: keys})
		if err != nil {
			t.Fatal(err)
		}
		return len(h.Entries) == 2+1+1+4+3
	})
	want := map[string]string{
		"credential-h1-1":       "",
		dead:                    "", // the genuine letter
		"forged-unsigned":       "carries no proof of its writer (only credential-h1 writes steward.outcomes.credential.h1)",
		"forged-other-instance": "written by credential-h9",
		"forged-impostor":       "the key is not credential-h1's",
		"forged-reflected":      "reflected onto steward.outcomes.credential.h1 by a direct get of $KV.STEWARD_CHECKPOINTS.st.credential.h9.outcome",
		"letter-unsigned":       "carries no proof of its writer (only credential-h1 writes steward.dlq.credential.h1)",
		"letter-other-instance": "written by credential-h9",
		"letter-reflected":      "reflected onto steward.dlq.credential.h1 by a direct get of $KV.STEWARD_CHECKPOINTS.st.credential.h9.letter",
	}
	seen := map[string]bool{}
	for _, e := range h.Entries {
		if e.Kind == ops.EntryEvent {
			continue
		}
		why, ok := want[e.ID]
		if !ok {
			t.Errorf("unexpected %s %s in the history", e.Kind, e.ID)
			continue
		}
		seen[e.ID] = true
		switch {
		case e.Unverified:
			t.Errorf("%s %s is unverified with keys given", e.Kind, e.ID)
		case why == "" && e.Forged != "":
			t.Errorf("the runtime's own %s %s is marked forged: %s", e.Kind, e.ID, e.Forged)
		case why != "" && !strings.Contains(e.Forged, why):
			t.Errorf("%s %s: forged %q, want it to say %q", e.Kind, e.ID, e.Forged, why)
		}
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("%s is missing from the history", id)
		}
	}
	if h.Forged != 7 {
		t.Errorf("the history counts %d forged entries, want 7", h.Forged)
	}
	if len(h.Unreadable) != 0 {
		t.Errorf("unreadable: %+v", h.Unreadable)
	}

	// Without keys nothing is called forged, and nothing is vouched for.
	bare, err := ops.GetHistory(ctx, js, ops.HistoryOptions{Worker: "credential", Key: victim})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range bare.Entries {
		if e.Kind != ops.EntryEvent && (e.Forged != "" || !e.Unverified) {
			t.Errorf("without keys, %s %s: forged %q, unverified %v", e.Kind, e.ID, e.Forged, e.Unverified)
		}
	}
}

// TestForgedLettersAreMarkedAndNeverRetried lists the victim's dead
// letters with keys, proves the forged ones are marked and the runtime's
// own is not, and that a retry republishes none of the forged ones: each
// is refused and kept.
func TestForgedLettersAreMarkedAndNeverRetried(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	nc := srv.Connect(t)
	ctx := context.Background()
	dead := runVictim(t, js)
	dlq := events.DLQSubject("credential", victim)
	for _, msg := range []*nats.Msg{forgedLetter(t, "letter-unsigned", nil, dlq), forgedLetter(t, "letter-other-instance", workertest.Signer(attacker), dlq)} {
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	reflect(t, nc, "st.credential.h9.letter", dlq, forgedLetter(t, "letter-reflected", workertest.Signer(attacker), events.DLQSubject("credential", "h9")))

	keys := ops.Proofs{Verifier: workertest.Verifier()}
	var letters []ops.Letter
	workertest.WaitUntil(t, "the reflected letter is stored", func() bool {
		l, err := ops.ListLetters(ctx, js, ops.LetterFilter{Worker: "credential"}, keys)
		if err != nil {
			t.Fatal(err)
		}
		letters = l.Letters
		return len(letters) == 4
	})
	var forged []ops.Letter
	for _, l := range letters {
		switch {
		case l.EventID == dead && l.Forged != "":
			t.Errorf("the runtime's own letter is marked forged: %s", l.Forged)
		case l.EventID != dead && l.Forged == "":
			t.Errorf("letter %d (%s) is not marked forged", l.Sequence, l.EventID)
		case l.EventID != dead:
			forged = append(forged, l)
		}
	}
	if len(forged) != 3 {
		t.Fatalf("%d letters marked forged, want 3", len(forged))
	}
	got, err := ops.GetLetter(ctx, js, forged[0].Sequence, keys)
	if err != nil || got.Forged == "" {
		t.Errorf("GetLetter of a forged letter: forged %q, %v", got.Forged, err)
	}

	rep, err := ops.RetryLetters(ctx, js, forged, ops.RetryOptions{ActOptions: ops.ActOptions{NoAuditEvents: true}})
	if err != nil {
		t.Fatal(err)
	}
	// They share a key, so the first refused holds the rest behind it;
	// none is republished.
	refused := 0
	for _, r := range rep.Results {
		switch {
		case r.Result == ops.ResultRefused && strings.Contains(r.Error, "is forged"):
			refused++
		case r.Result == ops.ResultHeld:
		default:
			t.Errorf("retry of forged letter %d: %s %q", r.Sequence, r.Result, r.Error)
		}
	}
	if refused == 0 {
		t.Error("no forged letter was refused as forged")
	}
	if n := len(list(t, js, ops.LetterFilter{Worker: "credential"})); n != 4 {
		t.Errorf("%d letters left after refusing the forged ones, want all 4", n)
	}
	if len(rep.Results) != 3 {
		t.Errorf("%d results, want 3", len(rep.Results))
	}
}
