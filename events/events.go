// Package events defines Steward's CloudEvents: their types, their data, the
// NATS subjects they travel on, the keys that order them, and the codec that
// carries them over NATS headers.
package events

import (
	"encoding/json"
	"fmt"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// The CloudEvents types Steward's publishers emit. Each has a JSON Schema
// under schema/ and exactly one data struct below.
const (
	TypeReleasePublished   = "dev.steward.release.published.v1"
	TypeInvitationWritten  = "dev.steward.invitation.written.v1"
	TypeHostFloorPublished = "dev.steward.hostfloor.published.v1"
	TypeCredentialRotated  = "dev.steward.credential.rotated.v1"
	TypeGrantChanged       = "dev.steward.grant.changed.v1"
)

// Subject prefixes of the three streams (docs/design.md §3).
const (
	EventsPrefix   = "steward.events"
	OutcomesPrefix = "steward.outcomes"
	DLQPrefix      = "steward.dlq"
)

// ContentTypeJSON is the datacontenttype of every Steward event.
const ContentTypeJSON = "application/json"

// Kind describes one event type: where it travels and how its key is read.
type Kind struct {
	// Type is the CloudEvents type.
	Type string
	// Subject is the NATS subject, or its prefix when KeyInSubject is set.
	Subject string
	// KeyInSubject says the key is the subject's last token.
	KeyInSubject bool
	// KeyField is the data field that holds the key; the CloudEvents
	// subject attribute must equal it.
	KeyField string
	// KeyIsVersion says the key is a semantic version rather than a
	// subject token (a release's version may hold dots).
	KeyIsVersion bool
}

var kinds = []Kind{
	{Type: TypeReleasePublished, Subject: EventsPrefix + ".release.published", KeyField: "version", KeyIsVersion: true},
	{Type: TypeInvitationWritten, Subject: EventsPrefix + ".invitation.written", KeyInSubject: true, KeyField: "box"},
	{Type: TypeHostFloorPublished, Subject: EventsPrefix + ".hostfloor.published", KeyField: "deployment"},
	{Type: TypeCredentialRotated, Subject: EventsPrefix + ".credential.rotated", KeyInSubject: true, KeyField: "hive"},
	{Type: TypeGrantChanged, Subject: EventsPrefix + ".grant.changed", KeyInSubject: true, KeyField: "machine"},
	{Type: TypeSiteMembership, Subject: EventsPrefix + ".site.membership", KeyInSubject: true, KeyField: "site"},
}

// Kinds lists every event type Steward knows, in catalog order.
func Kinds() []Kind { return append([]Kind(nil), kinds...) }

// Lookup returns the kind of a CloudEvents type.
func Lookup(typ string) (Kind, bool) {
	for _, k := range kinds {
		if k.Type == typ {
			return k, true
		}
	}
	return Kind{}, false
}

// SubjectFor returns the NATS subject an event of this kind with this key is
// published on. The key is checked first, so nothing unchecked reaches a
// subject.
func (k Kind) SubjectFor(key string) (string, error) {
	if err := k.CheckKey(key); err != nil {
		return "", err
	}
	if k.KeyInSubject {
		return k.Subject + "." + key, nil
	}
	return k.Subject, nil
}

// CheckKey validates a key for this kind: a semantic version for releases,
// a subject token for everything else.
func (k Kind) CheckKey(key string) error {
	if k.KeyIsVersion {
		return CheckVersion(key)
	}
	return CheckKey(key)
}

// FilterSubject returns the subject a consumer filters on to see this kind's
// events for one key ("" or "*" means every key).
func (k Kind) FilterSubject(key string) string {
	if !k.KeyInSubject {
		return k.Subject
	}
	if key == "" {
		key = "*"
	}
	return k.Subject + "." + key
}

// ReleasePublished says a release was published. It names a version only:
// what that version runs is read from the worker's own registry.
type ReleasePublished struct {
	Version        string `json:"version"`
	ManifestDigest string `json:"manifestDigest,omitempty"`
}

// InvitationWritten carries the console's signed invitation for one box.
type InvitationWritten struct {
	Box      string        `json:"box"`
	Envelope dsse.Envelope `json:"envelope"`
}

// HostFloorPublished carries the release key's signed host floor for a
// deployment.
type HostFloorPublished struct {
	Deployment string        `json:"deployment"`
	Envelope   dsse.Envelope `json:"envelope"`
}

// CredentialRotated carries a hive's new credential. Secret is armored age
// ciphertext to the hive's recipient; the plaintext never travels.
//
// Envelope is the controller's DSSE signature over a Rotation that names
// the hive and binds every other field (docs/design.md §7): the
// hive's recipient is public, so without it anyone who can publish could
// hand the hive a pair of their own. The schema leaves it optional so the
// wire type stays usable as a plain test event; the credential worker
// refuses a rotation without one.
type CredentialRotated struct {
	Hive     string         `json:"hive"`
	Version  uint64         `json:"version"`
	ClientID string         `json:"clientId"`
	Secret   string         `json:"secret"`
	Envelope *dsse.Envelope `json:"envelope,omitempty"`
}

// GrantChanged is the whole desired state of one machine's database grants,
// never a delta.
//
// Envelope is the controller's DSSE signature over a Grant that names the
// machine and binds every other field; the provision worker refuses a grant
// without one (see CredentialRotated for why, and why it is optional in the
// schema).
type GrantChanged struct {
	Machine     string         `json:"machine"`
	Requirement string         `json:"requirement"`
	Generation  uint64         `json:"generation"`
	Given       []Given        `json:"given"`
	Envelope    *dsse.Envelope `json:"envelope,omitempty"`
}

// Given is one consumer granted a database on the machine. Secret is the
// consumer's password, armored age ciphertext to the machine's recipient.
type Given struct {
	From   string      `json:"from"`
	Node   string      `json:"node"`
	Values GivenValues `json:"values"`
	Secret string      `json:"secret"`
}

// GivenValues holds the consumer's requested settings.
type GivenValues struct {
	Name string `json:"name"`
}

// PayloadTypeInvitation, PayloadTypeHostFloor, PayloadTypeRotation and
// PayloadTypeGrant are the DSSE payload types of the four signed envelopes.
const (
	PayloadTypeInvitation = "application/vnd.steward.invitation.v1+json"
	PayloadTypeHostFloor  = "application/vnd.steward.hostfloor.v1+json"
	PayloadTypeRotation   = "application/vnd.steward.rotation.v1+json"
	PayloadTypeGrant      = "application/vnd.steward.grant.v1+json"
)

// Rotation is the payload of a credential.rotated envelope: what the
// controller vouches for. It names the hive and repeats the version and
// client id, and it binds the secret by the hex SHA-256 of its armored
// ciphertext (the data's secret string, byte for byte), so the signer never
// needs the plaintext and no field of the event can be swapped under the
// signature.
type Rotation struct {
	V            int    `json:"v"`
	Hive         string `json:"hive"`
	Version      uint64 `json:"version"`
	ClientID     string `json:"clientId"`
	SecretSHA256 string `json:"secretSHA256"`
}

// Grant is the payload of a grant.changed envelope: the machine, the
// requirement, the generation and every consumer in the data's order, each
// secret bound by the hex SHA-256 of its armored ciphertext.
type Grant struct {
	V           int          `json:"v"`
	Machine     string       `json:"machine"`
	Requirement string       `json:"requirement"`
	Generation  uint64       `json:"generation"`
	Given       []GrantGiven `json:"given"`
}

// GrantGiven is one consumer of a signed Grant.
type GrantGiven struct {
	From         string      `json:"from"`
	Node         string      `json:"node"`
	Values       GivenValues `json:"values"`
	SecretSHA256 string      `json:"secretSHA256"`
}

// Invitation is the payload of an invitation envelope.
type Invitation struct {
	V              int    `json:"v"`
	Deployment     string `json:"deployment"`
	Box            string `json:"box"`
	Enrollment     string `json:"enrollment"`
	EvidenceSHA256 string `json:"evidenceSHA256"`
	IssuedAt       string `json:"issuedAt"`
}

// HostFloor is the payload of a host floor envelope.
type HostFloor struct {
	V               int      `json:"v"`
	Deployment      string   `json:"deployment"`
	MinAgentVersion string   `json:"minAgentVersion"`
	Binaries        []string `json:"binaries"`
}

// KeyOf reads an event's key from its data, by its kind's key field.
func KeyOf(typ string, data []byte) (string, error) {
	k, ok := Lookup(typ)
	if !ok {
		return "", fmt.Errorf("type %q is not a Steward event type", typ)
	}
	var fields map[string]any
	if err := json.Unmarshal(data, &fields); err != nil {
		return "", fmt.Errorf("data of %s is not a JSON object: %w", typ, err)
	}
	return k.keyIn(typ, fields)
}

// keyIn reads the key field of data already decoded.
func (k Kind) keyIn(typ string, doc any) (string, error) {
	fields, _ := doc.(map[string]any)
	key, _ := fields[k.KeyField].(string)
	if key == "" {
		return "", fmt.Errorf("data of %s has no string field %q to key it by", typ, k.KeyField)
	}
	return key, nil
}
