package signing

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/strictjson"
)

// Desired state that hands out access (a hive's credential, a machine's
// database grants) is signed by the controller's key like invitations are
// by the console's (docs/design.md §7): the hive's and the
// machine's age recipients are public, so encryption proves nothing about
// who sent a rotation or a grant, and a version or generation nobody vouched
// for could pin the key for ever. The envelope's payload names the hive or
// machine and binds every field of the event, so no field can be swapped
// under a valid signature.

// SignedTypes are the event types that carry the controller's envelope and
// that workers refuse without it.
var SignedTypes = []string{events.TypeCredentialRotated, events.TypeGrantChanged}

// MustSign reports whether events of type typ must be signed by the
// controller.
func MustSign(typ string) bool { return slices.Contains(SignedTypes, typ) }

// SignedFromRecord reports whether events of type typ are signed by the
// controller from a record of another shape than the event's data (a site
// membership: the record lists the keys, the data holds only the
// envelope). They are signed by the operator alone (steward publish
// --signing-key --file), never by an ingress or the console: which site
// hears which key is not a token holder's to say, so they are not in
// SignedTypes.
func SignedFromRecord(typ string) bool { return typ == events.TypeSiteMembership }

// The rules an unverified desired state breaks, as the workers' refused
// outcomes name them.
const (
	// RuleUnsigned: the event carries no envelope.
	RuleUnsigned = "unsigned"
	// RuleSignature: the envelope does not verify with the controller keys.
	RuleSignature = "signature"
	// RulePayload: the signed payload is not a strict v 1 document.
	RulePayload = "payload"
	// RuleBinding: the signed payload disagrees with the event's fields.
	RuleBinding = "binding"
)

// ErrUnsigned says an event that must be signed carries no envelope.
var ErrUnsigned = errors.New("not signed by the controller")

// ErrNotBound says a verified payload disagrees with the event it came in.
var ErrNotBound = errors.New("the signed payload does not match the event")

// StateError is why a signed desired state was not accepted: Rule is one
// of the Rule constants and Err says what was found. It never quotes a
// secret.
type StateError struct {
	Rule string
	Err  error
}

func (e *StateError) Error() string { return e.Err.Error() }
func (e *StateError) Unwrap() error { return e.Err }

func stateErr(rule string, format string, args ...any) *StateError {
	return &StateError{Rule: rule, Err: fmt.Errorf(format, args...)}
}

// SecretSHA256 is how a signed payload binds a secret: the hex SHA-256 of
// the armored ciphertext exactly as the data's string holds it. The signer
// never needs the plaintext.
func SecretSHA256(armored string) string {
	sum := sha256.Sum256([]byte(armored))
	return hex.EncodeToString(sum[:])
}

// RotationPayload is the payload the controller signs for data.
func RotationPayload(data events.CredentialRotated) events.Rotation {
	return events.Rotation{V: 1, Hive: data.Hive, Version: data.Version, ClientID: data.ClientID, SecretSHA256: SecretSHA256(data.Secret)}
}

// GrantPayload is the payload the controller signs for data.
func GrantPayload(data events.GrantChanged) events.Grant {
	g := events.Grant{V: 1, Machine: data.Machine, Requirement: data.Requirement, Generation: data.Generation, Given: make([]events.GrantGiven, 0, len(data.Given))}
	for _, c := range data.Given {
		g.Given = append(g.Given, events.GrantGiven{From: c.From, Node: c.Node, Values: c.Values, SecretSHA256: SecretSHA256(c.Secret)})
	}
	return g
}

// SignRotation returns data with its envelope set to key's signature over
// RotationPayload(data); any envelope data held is replaced.
func SignRotation(key crypto.Signer, data events.CredentialRotated) (events.CredentialRotated, error) {
	env, err := signPayload(key, events.PayloadTypeRotation, RotationPayload(data))
	if err != nil {
		return data, fmt.Errorf("sign the rotation of hive %s, version %d: %w", data.Hive, data.Version, err)
	}
	data.Envelope = &env
	return data, nil
}

// SignGrant returns data with its envelope set to key's signature over
// GrantPayload(data); any envelope data held is replaced.
func SignGrant(key crypto.Signer, data events.GrantChanged) (events.GrantChanged, error) {
	env, err := signPayload(key, events.PayloadTypeGrant, GrantPayload(data))
	if err != nil {
		return data, fmt.Errorf("sign the grant of machine %s, generation %d: %w", data.Machine, data.Generation, err)
	}
	data.Envelope = &env
	return data, nil
}

func signPayload(key crypto.Signer, payloadType string, v any) (dsse.Envelope, error) {
	payload, err := json.Marshal(v)
	if err != nil {
		return dsse.Envelope{}, err
	}
	return SignEnvelope(key, payloadType, payload)
}

// SignEvent signs a credential.rotated or grant.changed event with the
// controller's key: its data is read strictly (no unknown, duplicate or
// miscased key, so what is signed is what a reviewer reads), its envelope
// set (any it held is replaced) and the data written back. Events of other
// types are returned as they are. Validate the event first: SignEvent
// signs whatever field values it is given.
//
// A site.membership event's data is a MembershipRecord, which SignEvent
// checks itself and turns into {site, envelope}: its signed data has
// another shape, so it is validated after signing (SignedFromRecord).
func SignEvent(key crypto.Signer, e event.Event) (event.Event, error) {
	var data any
	switch e.Type() {
	case events.TypeCredentialRotated:
		var r events.CredentialRotated
		if err := strictjson.Decode(e.Data(), &r); err != nil {
			return e, fmt.Errorf("event %s: the data of %s cannot be signed as it is read: %w", e.ID(), e.Type(), err)
		}
		signed, err := SignRotation(key, r)
		if err != nil {
			return e, fmt.Errorf("event %s: %w", e.ID(), err)
		}
		data = signed
	case events.TypeGrantChanged:
		var g events.GrantChanged
		if err := strictjson.Decode(e.Data(), &g); err != nil {
			return e, fmt.Errorf("event %s: the data of %s cannot be signed as it is read: %w", e.ID(), e.Type(), err)
		}
		signed, err := SignGrant(key, g)
		if err != nil {
			return e, fmt.Errorf("event %s: %w", e.ID(), err)
		}
		data = signed
	case events.TypeSiteMembership:
		signed, err := signMembershipRecord(key, e.Subject(), e.Data())
		if err != nil {
			return e, fmt.Errorf("event %s: %w", e.ID(), err)
		}
		data = signed
	default:
		return e, nil
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return e, fmt.Errorf("event %s: %w", e.ID(), err)
	}
	out := e.Clone()
	// As a value, not bytes: bytes would be written as data_base64 in the
	// JSON event format, and a recorded stream stays readable as JSON.
	if err := out.SetData(events.ContentTypeJSON, json.RawMessage(raw)); err != nil {
		return e, fmt.Errorf("event %s: %w", e.ID(), err)
	}
	return out, nil
}

// EventSigner signs desired state with one controller key. It is what
// `steward publish --signing-key`, `steward serve --signing-key` (the
// ingress and the console's Signer) and `steward dev` sign with.
type EventSigner struct {
	key crypto.Signer
	id  string
}

// LoadEventSigner reads an ed25519 controller private key (PEM PKCS#8).
func LoadEventSigner(path string) (*EventSigner, error) {
	key, err := LoadPrivateKey(path)
	if err != nil {
		return nil, err
	}
	return NewEventSigner(key)
}

// NewEventSigner signs with key, which must be ed25519.
func NewEventSigner(key crypto.Signer) (*EventSigner, error) {
	if _, ok := key.Public().(ed25519.PublicKey); !ok {
		return nil, fmt.Errorf("the controller key is a %T; desired state is signed with ed25519 (steward keys --kind controller)", key.Public())
	}
	id, err := SignerKeyID(key)
	if err != nil {
		return nil, err
	}
	return &EventSigner{key: key, id: id}, nil
}

// Public is the signer's public key, which verifies what it signed.
func (s *EventSigner) Public() crypto.PublicKey { return s.key.Public() }

// KeyID is the DSSE key id the signer's envelopes carry.
func (s *EventSigner) KeyID() string { return s.id }

// Sign is SignEvent with the signer's key. Its ctx is unused; the method
// has the shape of the console's Signer hook.
func (s *EventSigner) Sign(_ context.Context, e event.Event) (event.Event, error) {
	return SignEvent(s.key, e)
}

// OpenRotation verifies a rotation's envelope with the controller keys,
// decodes its payload strictly and checks that it binds every field of
// data (the hive, version, client id and the secret's SHA-256). It returns
// the signed payload, or a *StateError saying which rule failed.
func OpenRotation(keys *KeySet, data events.CredentialRotated) (events.Rotation, error) {
	var got events.Rotation
	if data.Envelope == nil {
		return got, &StateError{Rule: RuleUnsigned, Err: fmt.Errorf("%w: the event carries no envelope", ErrUnsigned)}
	}
	if err := openStrict(keys, *data.Envelope, events.PayloadTypeRotation, &got, "rotation"); err != nil {
		return got, err
	}
	want := normalised(RotationPayload(data))
	switch {
	case got.V != 1:
		return got, stateErr(RulePayload, "its signed payload has v %d; this worker reads v 1 rotations only", got.V)
	case got.Hive != want.Hive:
		return got, stateErr(RuleBinding, "%w: it is signed for hive %.70q, not hive %q", ErrNotBound, got.Hive, want.Hive)
	case got.Version != want.Version:
		return got, stateErr(RuleBinding, "%w: it is signed for version %d, not version %d", ErrNotBound, got.Version, want.Version)
	case got.ClientID != want.ClientID:
		return got, stateErr(RuleBinding, "%w: it is signed for client id %.70q, not %.70q", ErrNotBound, got.ClientID, want.ClientID)
	case got.SecretSHA256 != want.SecretSHA256:
		return got, stateErr(RuleBinding, "%w: the secret is not the ciphertext the controller signed (its SHA-256 %s is not the signed %.64q)", ErrNotBound, want.SecretSHA256, got.SecretSHA256)
	}
	return got, nil
}

// OpenGrant verifies a grant's envelope with the controller keys, decodes
// its payload strictly and checks that it binds every field of data (the
// machine, requirement, generation and each consumer in order, with its
// secret's SHA-256). It returns the signed payload, or a *StateError.
func OpenGrant(keys *KeySet, data events.GrantChanged) (events.Grant, error) {
	var got events.Grant
	if data.Envelope == nil {
		return got, &StateError{Rule: RuleUnsigned, Err: fmt.Errorf("%w: the event carries no envelope", ErrUnsigned)}
	}
	if err := openStrict(keys, *data.Envelope, events.PayloadTypeGrant, &got, "grant"); err != nil {
		return got, err
	}
	want := normalised(GrantPayload(data))
	switch {
	case got.V != 1:
		return got, stateErr(RulePayload, "its signed payload has v %d; this worker reads v 1 grants only", got.V)
	case got.Machine != want.Machine:
		return got, stateErr(RuleBinding, "%w: it is signed for machine %.70q, not machine %q", ErrNotBound, got.Machine, want.Machine)
	case got.Requirement != want.Requirement:
		return got, stateErr(RuleBinding, "%w: it is signed for requirement %.70q, not %.70q", ErrNotBound, got.Requirement, want.Requirement)
	case got.Generation != want.Generation:
		return got, stateErr(RuleBinding, "%w: it is signed for generation %d, not generation %d", ErrNotBound, got.Generation, want.Generation)
	case len(got.Given) != len(want.Given):
		return got, stateErr(RuleBinding, "%w: it is signed for %d consumers, the event grants %d", ErrNotBound, len(got.Given), len(want.Given))
	}
	for i := range want.Given {
		g, w := got.Given[i], want.Given[i]
		switch {
		case g.Node != w.Node:
			return got, stateErr(RuleBinding, "%w: consumer %d is signed as node %.70q, the event names %.70q", ErrNotBound, i, g.Node, w.Node)
		case g.From != w.From:
			return got, stateErr(RuleBinding, "%w: consumer %q is signed as from %.70q, the event says %.70q", ErrNotBound, w.Node, g.From, w.From)
		case g.Values != w.Values:
			return got, stateErr(RuleBinding, "%w: consumer %q is signed for database %.70q, the event names %.70q", ErrNotBound, w.Node, g.Values.Name, w.Values.Name)
		case g.SecretSHA256 != w.SecretSHA256:
			return got, stateErr(RuleBinding, "%w: the secret of consumer %q is not the ciphertext the controller signed (its SHA-256 %s is not the signed %.64q)", ErrNotBound, w.Node, w.SecretSHA256, g.SecretSHA256)
		}
	}
	return got, nil
}

// normalised is v as the signer's JSON carries it: encoding/json writes
// invalid UTF-8 as U+FFFD, so a field the signer was given in memory is
// compared with what it signed, not with bytes no JSON document can hold.
// Off the bus the data went through JSON too and nothing changes.
func normalised[T any](v T) T {
	raw, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out T
	if json.Unmarshal(raw, &out) != nil {
		return v
	}
	return out
}

// openStrict verifies env and decodes its payload into v as a reviewer
// reads it (see internal/strictjson).
func openStrict(keys *KeySet, env dsse.Envelope, payloadType string, v any, kind string) error {
	if keys == nil || keys.Len() == 0 {
		return stateErr(RuleSignature, "no controller key is configured to verify it")
	}
	payload, _, err := keys.OpenEnvelope(env, payloadType)
	if err != nil {
		return stateErr(RuleSignature, "its envelope does not verify with the controller keys: %w", err)
	}
	if err := strictjson.Decode(payload, v); err != nil {
		return stateErr(RulePayload, "its signed payload is not a v 1 %s: %w", kind, err)
	}
	return nil
}

// DevControllerKey is the development controller key pair under dir
// (controller.key, 0600, and controller.pub), made on first use and
// reused after: `steward dev` signs its printed publish lines, its
// ingress and its console with the private half, and its credential and
// provision workers verify with the public half.
func DevControllerKey(dir string) (privPath, pubPath string, err error) {
	privPath, pubPath = filepath.Join(dir, "controller.key"), filepath.Join(dir, "controller.pub")
	_, privErr := os.Stat(privPath)
	_, pubErr := os.Stat(pubPath)
	switch {
	case privErr == nil && pubErr == nil:
		return privPath, pubPath, nil
	case privErr == nil || pubErr == nil:
		return "", "", fmt.Errorf("development controller key: only one of %s and %s exists; remove it to have a new pair made", privPath, pubPath)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("development controller key: %w", err)
	}
	if err := GenerateKeyPair(Ed25519, privPath, pubPath); err != nil {
		return "", "", fmt.Errorf("development controller key: %w", err)
	}
	return privPath, pubPath, nil
}
