package events

import (
	"crypto/ed25519"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/internal/proof"
)

func testKeys(t *testing.T, by string) (*proof.Signer, *proof.Verifier) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := proof.NewSigner(priv, by, "")
	v := proof.NewVerifier()
	v.Pin(by, s.Public())
	return s, v
}

// signedOutcome is a replayed outcome as the runtime encodes and signs it.
func signedOutcome(t *testing.T, s *proof.Signer, subject string) (event.Event, *nats.Msg) {
	t.Helper()
	e := event.New()
	e.SetID("credential-h1-7-replay-01j")
	e.SetType(OutcomeType("credential", "applied"))
	e.SetSource("/steward/credential/h1")
	e.SetSubject("h1")
	// Nanoseconds and a zone: the codec writes UTC RFC 3339, and the
	// content must be the same bytes read back.
	e.SetTime(time.Date(2026, 1, 2, 15, 4, 5, 123456789, time.FixedZone("x", 3600)))
	e.SetExtension("causationid", "rot-h1-7")
	e.SetExtension("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	e.SetExtension("replay", true)
	e.SetExtension("replayid", "01j")
	if err := e.SetData(ContentTypeJSON, map[string]any{"version": 7}); err != nil {
		t.Fatal(err)
	}
	msg, err := Encode(subject, e)
	if err != nil {
		t.Fatal(err)
	}
	SignMessage(msg, StreamOutcomes, "site-a", s, OutcomeProofContent(e))
	return e, msg
}

// TestOutcomeProofSurvivesTheWireAndBindsWhatItSays: the outcome a reader
// decodes verifies, and any change to what it says, where it is stored or
// who the reader expects does not.
func TestOutcomeProofSurvivesTheWireAndBindsWhatItSays(t *testing.T) {
	s, v := testKeys(t, "credential-h1")
	subject := OutcomeSubject("credential", "h1")
	_, msg := signedOutcome(t, s, subject)
	decoded, err := Decode(msg.Header, msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyOutcome(v, "site-a", subject, msg.Header, msg.Data, decoded); err != nil {
		t.Fatalf("the decoded outcome does not verify: %v", err)
	}
	changed := func(f func(e *event.Event)) event.Event {
		e := decoded.Clone()
		f(&e)
		return e
	}
	for name, c := range map[string]struct {
		domain, subject string
		e               event.Event
	}{
		"data":          {"site-a", subject, changed(func(e *event.Event) { _ = e.SetData(ContentTypeJSON, map[string]any{"version": 8}) })},
		"causation":     {"site-a", subject, changed(func(e *event.Event) { e.SetExtension("causationid", "rot-h1-8") })},
		"not a replay":  {"site-a", subject, changed(func(e *event.Event) { e.SetExtension("replay", nil) })},
		"time":          {"site-a", subject, changed(func(e *event.Event) { e.SetTime(e.Time().Add(time.Nanosecond)) })},
		"other domain":  {"site-b", subject, decoded},
		"other subject": {"site-a", OutcomeSubject("credential", "h2"), decoded},
	} {
		err := VerifyOutcome(v, c.domain, c.subject, msg.Header, msg.Data, c.e)
		if !errors.Is(err, proof.ErrForged) {
			t.Errorf("%s changed: %v, want a forgery", name, err)
		}
	}
	unsigned := nats.Header{}
	for k, vs := range msg.Header {
		if k != proof.Header {
			unsigned[k] = vs
		}
	}
	if err := VerifyOutcome(v, "site-a", subject, unsigned, msg.Data, decoded); !errors.Is(err, proof.ErrUnsigned) {
		t.Errorf("without its proof: %v, want unsigned", err)
	}

	// The operator runs replays: its proof stands for a replayed outcome
	// on an instance's subject, never for a live one.
	op, opv := testKeys(t, OperatorWriter)
	replayed, byOperator := signedOutcome(t, op, subject)
	if err := VerifyOutcome(opv, "site-a", subject, byOperator.Header, byOperator.Data, replayed); err != nil {
		t.Errorf("the operator's replayed outcome: %v", err)
	}
	live := replayed.Clone()
	live.SetExtension("replay", nil)
	msg2, err := Encode(subject, live)
	if err != nil {
		t.Fatal(err)
	}
	SignMessage(msg2, StreamOutcomes, "site-a", op, OutcomeProofContent(live))
	if err := VerifyOutcome(opv, "site-a", subject, msg2.Header, msg2.Data, live); !errors.Is(err, proof.ErrForged) {
		t.Errorf("the operator's live outcome on an instance's subject: %v, want a forgery", err)
	}
}

// TestDeadLetterProofBindsItsHeadersAndFitsItsLimit: a signed letter read
// back verifies; a changed reason or data does not; an oversize original
// still makes a letter under MaxBytes, proof included, that verifies.
func TestDeadLetterProofBindsItsHeadersAndFitsItsLimit(t *testing.T) {
	s, v := testKeys(t, "credential-h1")
	subject, h, data := sampleOriginal(t)
	src := LetterSource{Consumer: "credential-h1", DLQSubject: DLQSubject("credential", "h1"), Stream: StreamEvents,
		Sequence: 4, Subject: subject, Delivered: 2, Reason: "the hive's folder is gone", Header: h, Data: data, Signer: s}
	msg, _ := NewDeadLetter(src)
	d := ParseDeadLetter(9, msg.Subject, msg.Header, msg.Data)
	if err := d.VerifyProof(v, ""); err != nil {
		t.Fatalf("the letter does not verify: %v", err)
	}
	reason := ParseDeadLetter(9, msg.Subject, cloneHeader(msg.Header, HeaderError, "nothing wrong"), msg.Data)
	if err := reason.VerifyProof(v, ""); !errors.Is(err, proof.ErrForged) {
		t.Errorf("a changed reason: %v, want a forgery", err)
	}
	// Headers JetStream adds when it stores or answers are not the writer's.
	stored := ParseDeadLetter(9, msg.Subject, cloneHeader(msg.Header, "Nats-Sequence", "9"), msg.Data)
	if err := stored.VerifyProof(v, ""); err != nil {
		t.Errorf("with a Nats-* header added: %v", err)
	}

	big := src
	big.Data = []byte(`{"x":"` + strings.Repeat("a", 64<<10) + `"}`)
	big.MaxBytes = 8 << 10
	msg, _ = NewDeadLetter(big)
	if n := headerBytes(msg.Header) + len(msg.Data); n > big.MaxBytes {
		t.Errorf("the signed oversize letter weighs %d bytes, over its limit %d", n, big.MaxBytes)
	}
	if err := ParseDeadLetter(9, msg.Subject, msg.Header, msg.Data).VerifyProof(v, ""); err != nil {
		t.Errorf("the truncated letter does not verify: %v", err)
	}
	// The proof is counted before the letter chooses between the whole
	// original and a reference, so it never eats the margin left for the
	// header block's framing: originals on both sides of where a letter
	// stops copying whole (at about 3 KiB under an 8 KiB limit) all leave
	// it. The oversize one above cannot show this, its reference is far
	// under the limit.
	for size := 1 << 10; size <= 6<<10; size += 8 {
		near := big
		near.Data = []byte(`{"x":"` + strings.Repeat("a", size) + `"}`)
		msg, _ = NewDeadLetter(near)
		if n := headerBytes(msg.Header) + len(msg.Data); n > near.MaxBytes-letterMargin {
			t.Fatalf("an original of %d bytes makes a signed letter of %d bytes, inside the %d bytes kept free under its limit %d",
				len(near.Data), n, letterMargin, near.MaxBytes)
		}
	}
}

func cloneHeader(h nats.Header, name, value string) nats.Header {
	out := nats.Header{}
	for k, vs := range h {
		out[k] = append([]string(nil), vs...)
	}
	out.Set(name, value)
	return out
}
