package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/internal/signing"
)

// Message is one stored event or outcome as an operator reads it: its
// CloudEvents attributes, its data with every secret elided (ElideData),
// what its envelope proves, and for an outcome whether it verifies as its
// instance's. It is the payload of a history entry.
type Message struct {
	Stream   string    `json:"stream"`
	Sequence uint64    `json:"sequence"`
	Subject  string    `json:"subject"`
	Time     time.Time `json:"time"`
	ID       string    `json:"id"`
	Type     string    `json:"type"`
	Source   string    `json:"source"`
	Key      string    `json:"key"`
	// EventTime is the time attribute, as its publisher gave it.
	EventTime   time.Time `json:"eventTime"`
	CausationID string    `json:"causationId,omitempty"`
	TraceID     string    `json:"traceId,omitempty"`
	// Extensions are every other extension attribute, secrets elided.
	Extensions []Header `json:"extensions"`
	// Data is the data as pretty JSON, secret-named fields and armored
	// blocks elided.
	Data string `json:"data"`
	// Envelope is what the data's DSSE envelope proves; nil when the data
	// carries none.
	Envelope *EnvelopeCheck `json:"envelope,omitempty"`
	// Outcome-only: the instance it names, and Forged or Unverified as in
	// Entry.
	Instance   string `json:"instance,omitempty"`
	Forged     string `json:"forged,omitempty"`
	Unverified bool   `json:"unverified,omitempty"`
}

// EnvelopeCheck is what a history entry's envelope proves: whether it
// verifies, and with which key.
type EnvelopeCheck struct {
	// PayloadType is the envelope's, as it says (elided, cut).
	PayloadType string `json:"payloadType"`
	// KeyIDs are the key ids its signatures name.
	KeyIDs []string `json:"keyIds"`
	// Verified says a key of Keys verified it, and the signed payload
	// binds the event's fields; KeyID is that key.
	Verified bool   `json:"verified"`
	KeyID    string `json:"keyId,omitempty"`
	// Keys names the key set it was checked with ("controller"); empty
	// when the reader holds none for its kind, and then Problem says so.
	Keys string `json:"keys,omitempty"`
	// Rule and Problem say why it is not verified (the workers' rule:
	// signature, payload, binding), secrets elided.
	Rule    string `json:"rule,omitempty"`
	Problem string `json:"problem,omitempty"`
	// Payload is the signed payload as pretty JSON (elided as Data).
	Payload string `json:"payload,omitempty"`
}

// EnvelopeKeys are the key sets a reader checks envelopes with: the
// controller's, which signs credential.rotated, grant.changed and
// site.membership.
// Invitations (the console key) and host floors (the release key) are
// verified where they apply, on the boxes; a reader here names their
// signers' key ids only.
type EnvelopeKeys struct {
	Controller *signing.KeySet
}

// MessageStreams are the streams GetMessage reads: a dead letter has its
// own view (GetLetter), which also says what a retry would do.
var MessageStreams = []string{events.StreamEvents, events.StreamOutcomes}

// GetMessage reads the message at seq of stream (STEWARD_EVENTS or
// STEWARD_OUTCOMES) and decodes it as a CloudEvent. An outcome is checked
// with proofs as its instance's; an envelope in the data with keys.
func GetMessage(ctx context.Context, js jetstream.JetStream, stream string, seq uint64, proofs Proofs, keys EnvelopeKeys) (*Message, error) {
	if !slices.Contains(MessageStreams, stream) {
		return nil, fmt.Errorf("stream %q: a payload is read from %s; a dead letter from its own page", stream, strings.Join(MessageStreams, " or "))
	}
	s, err := streamOrNone(ctx, js, stream)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &NoStreamsError{Server: ServerURL(js)}
	}
	proofs = proofs.sourcedBy(s.CachedInfo())
	raw, err := s.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, fmt.Errorf("%s holds no message at sequence %d (removed by its limits, or never stored): %w", stream, seq, err)
		}
		return nil, fmt.Errorf("read %s sequence %d on %s: %w", stream, seq, ServerURL(js), err)
	}
	e, err := events.Decode(raw.Header, raw.Data)
	if err != nil {
		return nil, fmt.Errorf("%s sequence %d on %s is not a CloudEvent: %s", stream, seq, raw.Subject, redact.Line(err.Error()))
	}
	m := &Message{Stream: stream, Sequence: raw.Sequence, Subject: raw.Subject, Time: raw.Time.UTC(),
		ID: e.ID(), Type: e.Type(), Source: e.Source(), Key: e.Subject(), EventTime: e.Time().UTC(),
		TraceID: traceID(e), Extensions: []Header{}, Data: ElideData(e.Data(), false)}
	m.CausationID, _ = e.Extensions()["causationid"].(string)
	for name, v := range e.Extensions() {
		if name == "causationid" {
			continue
		}
		m.Extensions = append(m.Extensions, Header{Name: name, Value: redact.Line(fmt.Sprint(v))})
	}
	slices.SortFunc(m.Extensions, func(a, b Header) int { return strings.Compare(a.Name, b.Name) })
	if stream == events.StreamOutcomes {
		m.Instance = lastToken(raw.Subject)
		m.Forged, m.Unverified = proofs.outcome(raw.Subject, raw.Time, raw.Header, raw.Data, e)
	} else {
		m.Envelope = keys.Check(e)
	}
	return m, nil
}

// Check is what the envelope of event e proves, or nil when its data has
// none. The keys are chosen by the event's type, never by what the
// envelope says of itself.
func (k EnvelopeKeys) Check(e event.Event) *EnvelopeCheck {
	var holder struct {
		Envelope *dsse.Envelope `json:"envelope"`
	}
	if json.Unmarshal(e.Data(), &holder) != nil || holder.Envelope == nil {
		return nil
	}
	env := *holder.Envelope
	c := &EnvelopeCheck{PayloadType: redact.Cut(redact.Line(env.PayloadType), 120), KeyIDs: []string{}}
	for _, s := range env.Signatures {
		c.KeyIDs = append(c.KeyIDs, redact.Cut(redact.Line(s.KeyID), 120))
	}
	var set *signing.KeySet
	var want string
	switch e.Type() {
	case events.TypeCredentialRotated:
		set, want, c.Keys = k.Controller, events.PayloadTypeRotation, "controller"
	case events.TypeGrantChanged:
		set, want, c.Keys = k.Controller, events.PayloadTypeGrant, "controller"
	case events.TypeSiteMembership:
		set, want, c.Keys = k.Controller, events.PayloadTypeMembership, "controller"
	default:
		c.Problem = "not checked here: the join worker verifies it on the box, with the console key (invitations) or the release key (host floors)"
		return c
	}
	if set == nil {
		c.Problem = fmt.Sprintf("not checked: this reader holds no %s key, so it cannot say who signed it", c.Keys)
		c.Keys = ""
		return c
	}
	payload, id, err := set.OpenEnvelope(env, want)
	if err != nil {
		c.Rule, c.Problem = signing.RuleSignature, redact.Line(err.Error())
		return c
	}
	c.Payload, c.KeyID = ElideData(payload, false), id
	// Desired state is believed only when the signed payload binds the
	// event's fields, as the workers check it.
	var bindErr error
	switch e.Type() {
	case events.TypeCredentialRotated:
		var data events.CredentialRotated
		if bindErr = json.Unmarshal(e.Data(), &data); bindErr == nil {
			_, bindErr = signing.OpenRotation(set, data)
		}
	case events.TypeGrantChanged:
		var data events.GrantChanged
		if bindErr = json.Unmarshal(e.Data(), &data); bindErr == nil {
			_, bindErr = signing.OpenGrant(set, data)
		}
	case events.TypeSiteMembership:
		var data events.SiteMembership
		if bindErr = json.Unmarshal(e.Data(), &data); bindErr == nil {
			_, bindErr = signing.OpenMembership(set, data)
		}
	}
	if bindErr != nil {
		c.Rule = signing.RulePayload
		var se *signing.StateError
		if errors.As(bindErr, &se) {
			c.Rule = se.Rule
		}
		c.Problem = redact.Line(bindErr.Error())
		return c
	}
	c.Verified = true
	return c
}
