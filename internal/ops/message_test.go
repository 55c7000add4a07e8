package ops_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestMessageElidesSecretsAndChecksTheEnvelope reads an event's payload:
// the secret is elided, and the envelope verifies with the controller key
// that signed it, and not with another.
func TestMessageElidesSecretsAndChecksTheEnvelope(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	dir := t.TempDir()
	priv, pub, err := signing.DevControllerKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := signing.LoadPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	data, err := signing.SignRotation(key, rotation("h1", 1))
	if err != nil {
		t.Fatal(err)
	}
	ack := workertest.PublishData(t, js, events.TypeCredentialRotated, "h1", data)
	keys, err := signing.LoadEnvelopeKeys(pub)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ops.GetMessage(context.Background(), js, events.StreamEvents, ack.Sequence, ops.Proofs{}, ops.EnvelopeKeys{Controller: keys})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(m.Data, "BEGIN AGE") || !strings.Contains(m.Data, `"secret": "[elided]"`) {
		t.Fatalf("the data shown:\n%s", m.Data)
	}
	if m.Envelope == nil || !m.Envelope.Verified || m.Envelope.KeyID != keys.KeyIDs()[0] || m.Envelope.Keys != "controller" {
		t.Fatalf("the envelope: %+v", m.Envelope)
	}
	_, otherPub, err := signing.DevControllerKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := signing.LoadEnvelopeKeys(otherPub)
	if err != nil {
		t.Fatal(err)
	}
	m, err = ops.GetMessage(context.Background(), js, events.StreamEvents, ack.Sequence, ops.Proofs{}, ops.EnvelopeKeys{Controller: other})
	if err != nil {
		t.Fatal(err)
	}
	if m.Envelope == nil || m.Envelope.Verified || m.Envelope.Rule != signing.RuleSignature {
		t.Fatalf("the envelope checked with another key: %+v", m.Envelope)
	}
	m, err = ops.GetMessage(context.Background(), js, events.StreamEvents, ack.Sequence, ops.Proofs{}, ops.EnvelopeKeys{})
	if err != nil || m.Envelope == nil || m.Envelope.Verified || !strings.Contains(m.Envelope.Problem, "no controller key") {
		t.Fatalf("the envelope checked with no key: %+v, %v", m.Envelope, err)
	}
	if _, err := ops.GetMessage(context.Background(), js, events.StreamDLQ, 1, ops.Proofs{}, ops.EnvelopeKeys{}); err == nil {
		t.Fatal("a dead letter was read as a payload")
	}
}

// TestMessageOfAnOutcomeIsChecked: an outcome's payload is believed as its
// instance's only when it verifies: the runtime's own does, one stored
// unsigned on its subject is forged.
func TestMessageOfAnOutcomeIsChecked(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	ctx := context.Background()
	dead := runVictim(t, js)
	own := workertest.Outcomes(t, js, "credential", victim)
	if len(own) != 1 {
		t.Fatalf("%d outcomes of the victim; want its one applied", len(own))
	}
	ack, err := js.PublishMsg(ctx, encodeOn(t, events.OutcomeSubject("credential", victim), forgedOutcome(t, "forged-payload", dead), nil, ""), jetstream.WithExpectStream(events.StreamOutcomes))
	if err != nil {
		t.Fatal(err)
	}
	keys := ops.Proofs{Verifier: workertest.Verifier()}
	m, err := ops.GetMessage(ctx, js, events.StreamOutcomes, 1, keys, ops.EnvelopeKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Forged != "" || m.Unverified || m.Instance != victim || m.ID != own[0].ID() {
		t.Fatalf("the runtime's own outcome: %+v", m)
	}
	m, err = ops.GetMessage(ctx, js, events.StreamOutcomes, ack.Sequence, keys, ops.EnvelopeKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Forged == "" || m.CausationID != dead {
		t.Fatalf("an unsigned outcome on the victim's subject reads as %+v; want forged", m)
	}
}
