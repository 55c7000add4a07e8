package signing

import (
	"crypto"
	"fmt"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/strictjson"
)

// A site's membership is signed by the controller key as grants are: the
// event's data is only {site, envelope}, so everything a site set-up
// believes (the keys, the generation) is inside the signature, and the
// signed site binds it to the one site it was made for.

// MembershipRecord is a site's membership as the operator's desired state
// holds it (a {type, key, data} record for steward publish --signing-key):
// what the controller key signs, before it is signed.
type MembershipRecord struct {
	Site       string   `json:"site"`
	Generation uint64   `json:"generation"`
	Boxes      []string `json:"boxes"`
	Hives      []string `json:"hives"`
	Machines   []string `json:"machines"`
}

// SignMembership returns the data of a site.membership event: m checked
// (as a site set-up checks it) and signed with key.
func SignMembership(key crypto.Signer, m events.Membership) (events.SiteMembership, error) {
	if err := m.Check(m.Site); err != nil {
		return events.SiteMembership{}, fmt.Errorf("the membership of site %s, generation %d, is not signed: %w", m.Site, m.Generation, err)
	}
	env, err := signPayload(key, events.PayloadTypeMembership, m)
	if err != nil {
		return events.SiteMembership{}, fmt.Errorf("sign the membership of site %s, generation %d: %w", m.Site, m.Generation, err)
	}
	return events.SiteMembership{Site: m.Site, Envelope: env}, nil
}

// signMembershipRecord is SignMembership for a record read strictly from
// an event's data, issued now; the event's key must be the record's site.
func signMembershipRecord(key crypto.Signer, site string, data []byte) (events.SiteMembership, error) {
	var r MembershipRecord
	if err := strictjson.Decode(data, &r); err != nil {
		return events.SiteMembership{}, fmt.Errorf("a membership record is {site, generation, boxes, hives, machines}: %w", err)
	}
	if r.Site != site {
		return events.SiteMembership{}, fmt.Errorf("the record's site %.70q is not its key %q; a membership is signed for the one site it names", r.Site, site)
	}
	return SignMembership(key, events.Membership{
		V: 1, Site: r.Site, Generation: r.Generation,
		Boxes: nonNil(r.Boxes), Hives: nonNil(r.Hives), Machines: nonNil(r.Machines),
		IssuedAt: time.Now().UTC().Format(time.RFC3339),
	})
}

// nonNil writes an empty kind as [] rather than null, as a reviewer reads it.
func nonNil(keys []string) []string {
	if keys == nil {
		return []string{}
	}
	return keys
}

// OpenMembership verifies a membership's envelope with the controller
// keys, decodes its payload strictly and checks it (events.Membership.Check)
// against the event's site. It returns the signed membership, or a
// *StateError saying which rule failed.
func OpenMembership(keys *KeySet, data events.SiteMembership) (events.Membership, error) {
	var got events.Membership
	if len(data.Envelope.Signatures) == 0 && data.Envelope.Payload == "" {
		return got, &StateError{Rule: RuleUnsigned, Err: fmt.Errorf("%w: the event carries no envelope", ErrUnsigned)}
	}
	if err := openStrict(keys, data.Envelope, events.PayloadTypeMembership, &got, "site membership"); err != nil {
		return got, err
	}
	if got.V == 1 && got.Site != data.Site {
		return got, stateErr(RuleBinding, "%w: it is signed for site %.70q, not site %q", ErrNotBound, got.Site, data.Site)
	}
	if err := got.Check(data.Site); err != nil {
		return got, stateErr(RulePayload, "its signed payload is not a valid v 1 site membership: %w", err)
	}
	return got, nil
}
