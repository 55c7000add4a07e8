package events

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// Site membership (which keys belong to which site) has one writer, the
// controller: a site's hub consumer is filtered to the keys its newest
// signed membership lists, so whoever runs `steward site setup` no longer
// decides which site hears a key, and no two sites can both claim one
// (docs/design.md §9).

// TypeSiteMembership is the CloudEvents type of a site's membership.
const TypeSiteMembership = "dev.steward.site.membership.v1"

// PayloadTypeMembership is the DSSE payload type of a membership envelope.
const PayloadTypeMembership = "application/vnd.steward.sitemembership.v1+json"

// MembershipGenerationKey is the metadata key on the hub's consumer for a
// site (SiteConsumerConfig) that records the generation of the membership
// its filters were set up from: the floor below which no membership is
// applied, so an old signed membership replayed cannot roll a site back.
const MembershipGenerationKey = "steward.membership.generation"

// SiteMembership carries the controller's signed membership of one site.
// Its key is the site, which is also the site's JetStream domain.
type SiteMembership struct {
	Site     string        `json:"site"`
	Envelope dsse.Envelope `json:"envelope"`
}

// Membership is the payload of a membership envelope: the whole membership
// of one site, never a delta, so the newest one alone says which keys the
// site holds.
type Membership struct {
	V int `json:"v"`
	// Site must equal the event's site: a signature made for one site
	// never moves keys of another.
	Site string `json:"site"`
	// Generation only moves forward; a site applies none lower than the
	// one it applied.
	Generation uint64   `json:"generation"`
	Boxes      []string `json:"boxes"`
	Hives      []string `json:"hives"`
	Machines   []string `json:"machines"`
	IssuedAt   string   `json:"issuedAt"`
}

// MembershipSubject is the subject site's memberships are published on.
func MembershipSubject(site string) string {
	return EventsPrefix + ".site.membership." + site
}

// MembershipSubjects is the filter on every site's memberships.
func MembershipSubjects() string { return EventsPrefix + ".site.membership.*" }

// Check refuses a membership that is not a v 1 document for site: another
// site, no generation, a key that is no subject token, or a key listed
// twice within a kind. Each refusal names the field (as a JSON pointer)
// and the rule.
func (m Membership) Check(site string) error {
	switch {
	case m.V != 1:
		return fmt.Errorf("/v: %d, want 1 (rule: const)", m.V)
	case m.Site != site:
		return fmt.Errorf("/site: signed for site %.70q, not site %q (rule: the signed site is the event's key)", m.Site, site)
	case m.Generation == 0:
		return fmt.Errorf("/generation: missing or 0 (rule: minimum 1; a positive integer that only moves forward)")
	}
	if err := CheckDomain(m.Site); err != nil {
		return fmt.Errorf("/site: %w", err)
	}
	for field, keys := range map[string][]string{"boxes": m.Boxes, "hives": m.Hives, "machines": m.Machines} {
		seen := make(map[string]bool, len(keys))
		for i, k := range keys {
			if err := CheckKey(k); err != nil {
				return fmt.Errorf("/%s/%d: %w (rule: pattern)", field, i, err)
			}
			if seen[k] {
				return fmt.Errorf("/%s/%d: %s is listed twice (rule: uniqueItems)", field, i, k)
			}
			seen[k] = true
		}
	}
	return nil
}

// SiteOf is the site m describes, its events coming from hubDomain.
func (m Membership) SiteOf(hubDomain string) Site {
	return Site{Name: m.Site, HubDomain: hubDomain, Boxes: m.Boxes, Hives: m.Hives, Machines: m.Machines, Generation: m.Generation}
}

// Claims lists m's keys as "box NAME", "hive NAME" and "machine NAME", the
// form two memberships are compared in: a box and a hive of one name are
// different keys.
func (m Membership) Claims() []string {
	var out []string
	for _, k := range m.Boxes {
		out = append(out, "box "+k)
	}
	for _, k := range m.Hives {
		out = append(out, "hive "+k)
	}
	for _, k := range m.Machines {
		out = append(out, "machine "+k)
	}
	return out
}

// AppliedGeneration is the membership generation the hub's consumer for a
// site records (0: none, or a record that is no positive integer, which
// only an operator's hand can have written).
func AppliedGeneration(cfg jetstream.ConsumerConfig) uint64 {
	n, err := strconv.ParseUint(cfg.Metadata[MembershipGenerationKey], 10, 64)
	if err != nil {
		return 0
	}
	return n
}
