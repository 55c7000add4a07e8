package join_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestWrongKeyEnvelopeForArmedBox arms a box, then sends its invitation
// again signed by another key, and with the console's signature taken off:
// both are refused as not verifying (the worker used to read the payload
// first and report armed-already for anyone's envelope).
func TestWrongKeyEnvelopeForArmedBox(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-w")
	h, r := f.startRecording(js)
	f.publishFloor(js, f.floor("1.0.0"))
	f.publishInvitation(js, f.sign(f.invitation()))
	waitOutcomes(t, js, "box-w", join.OutcomeArmed, 1)

	_, stranger, _ := ed25519.GenerateKey(rand.Reader)
	strangers, err := join.SignInvitation(stranger, f.invitation())
	if err != nil {
		t.Fatal(err)
	}
	unsigned := f.sign(f.invitation())
	unsigned.Envelope.Signatures = strangers.Envelope.Signatures
	acks := []publisher.Ack{f.publishInvitation(js, strangers), f.publishInvitation(js, unsigned)}
	refused := waitOutcomes(t, js, "box-w", join.OutcomeRefused, 2)
	workertest.WaitIdle(t, js, r.ConsumerName())
	for i, ack := range acks {
		assertRefused(t, h, ack, "box-w", "[signature]", "does not verify with the console key")
		if refused[i]["rule"] != "signature" {
			t.Errorf("refused outcome %v, want rule signature", refused[i])
		}
	}
	if got := outcomes(t, js, "box-w", join.OutcomeArmedAlready); len(got) != 0 {
		t.Fatalf("an envelope signed by another key produced armed-already: %v", got)
	}
	assertNoDeadLetters(t, js, "box-w")
	if n := f.armRuns(); n != 1 {
		t.Fatalf("the arm command ran %d times, want 1", n)
	}
}

// TestFutureIssuedAtIsRefused sends a validly signed invitation issued a
// day from now: it is refused with the rule and the skew allowed, and the
// real invitation after it still arms (it used to be accepted and make
// every later invitation superseded until that day). One within the skew
// allowed is accepted.
func TestFutureIssuedAtIsRefused(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	f := newFixture(t, "box-t")
	h, r := f.startRecording(js)
	f.publishFloor(js, f.floor("1.0.0"))

	future := f.invitation()
	future.Enrollment = "enr-future"
	future.IssuedAt = time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	ack := f.publishInvitation(js, f.sign(future))
	refused := waitOutcomes(t, js, "box-t", join.OutcomeRefused, 1)
	workertest.WaitIdle(t, js, r.ConsumerName())
	assertRefused(t, h, ack, "box-t", "[issuedAt]", "ahead of this box's clock", "beyond the 5m0s allowed (--max-clock-skew)", "the guard was not armed")
	if refused[0]["rule"] != "issuedAt" || !strings.Contains(refused[0]["reason"], "would supersede every later one") {
		t.Fatalf("refused outcome %v", refused[0])
	}
	f.assertOptEmpty()

	now := f.invitation()
	now.IssuedAt = time.Now().UTC().Format(time.RFC3339)
	f.publishInvitation(js, f.sign(now))
	armed := waitOutcomes(t, js, "box-t", join.OutcomeArmed, 1)
	if armed[0]["enrollment"] != "enr-1" {
		t.Fatalf("armed %v", armed[0])
	}

	// A clock a minute ahead is within the skew allowed.
	soon := f.invitation()
	soon.Enrollment = "enr-soon"
	soon.IssuedAt = time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	f.publishInvitation(js, f.sign(soon))
	armed = waitOutcomes(t, js, "box-t", join.OutcomeArmed, 2)
	if armed[1]["enrollment"] != "enr-soon" {
		t.Fatalf("armed %v", armed[1])
	}
	if got := outcomes(t, js, "box-t", join.OutcomeSuperseded); len(got) != 0 {
		t.Fatalf("superseded %v", got)
	}
	assertNoDeadLetters(t, js, "box-t")
}
