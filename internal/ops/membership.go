package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/streamread"
)

// Why a site's membership was not applied; each error wraps one of these
// and names the site, the state found and what to do.
var (
	// ErrNoMembership: STEWARD_EVENTS holds no membership for the site.
	ErrNoMembership = errors.New("no site.membership event")
	// ErrMembershipNotBelieved: none of the site's memberships verifies
	// with the controller keys as a membership of that site.
	ErrMembershipNotBelieved = errors.New("no site.membership event of it is believed")
	// ErrKeyClaimed: a key of the membership is in another site's verified
	// membership of the highest generation.
	ErrKeyClaimed = errors.New("a key is claimed by another site")
)

// membershipRead is what the hub holds of one site's memberships.
type membershipRead struct {
	// newest is the last message on the site's subject, whatever it says.
	newest jetstream.Msg
	// best is the verified membership of the highest generation, and seq
	// its stream sequence: what the site's keys are, as far as other sites
	// are concerned. A forged or replayed one never hides a newer claim.
	best    *events.Membership
	bestSeq uint64
}

// MembershipSite reads the site.membership events of site from the hub's
// STEWARD_EVENTS (hubJS), takes the one of the highest generation that
// verifies with the controller keys, and checks that no key of it is
// claimed by the verified membership of the highest generation of another
// site, nor received now by another site set up at the hub (one owner per
// key). It returns the site to set up, its
// keys and generation the signed ones; events.SetupSite then refuses a
// generation below the one the site's filters were set up from.
func MembershipSite(ctx context.Context, hubJS jetstream.JetStream, keys *signing.KeySet, site, hubDomain string) (events.Site, error) {
	if err := events.CheckDomain(site); err != nil {
		return events.Site{}, fmt.Errorf("site name: %w", err)
	}
	reads := map[string]*membershipRead{}
	// Every site's memberships, read once in stream order: the newest of
	// this site's, and each other site's verified claims.
	err := streamread.Each(ctx, hubJS, streamread.Range{Stream: events.StreamEvents, Subjects: []string{events.MembershipSubjects()}}, func(m jetstream.Msg) error {
		name := m.Subject()[strings.LastIndexByte(m.Subject(), '.')+1:]
		r := reads[name]
		if r == nil {
			r = &membershipRead{}
			reads[name] = r
		}
		r.newest = m
		got, err := openMembership(keys, name, m)
		if err != nil {
			return nil
		}
		if r.best == nil || got.Generation >= r.best.Generation {
			meta, _ := m.Metadata()
			r.best, r.bestSeq = &got, seqOf(meta)
		}
		return nil
	})
	if err != nil {
		return events.Site{}, fmt.Errorf("site %s: read the site.membership events of the hub's %s: %w", site, events.StreamEvents, err)
	}
	own := reads[site]
	if own == nil {
		return events.Site{}, fmt.Errorf("site %s: %w for it in %s, so the site's filters were not changed; publish one with steward publish --file F --signing-key CONTROLLER.key, F holding {\"type\":%q,\"key\":%q,\"data\":{\"site\":%q,\"generation\":1,\"boxes\":[],\"hives\":[],\"machines\":[]}}, or give its keys with --boxes, --hives, --machines (unsigned: an open bus or a first set-up)",
			site, ErrNoMembership, events.StreamEvents, events.TypeSiteMembership, site, site)
	}
	if own.best == nil {
		meta, _ := own.newest.Metadata()
		_, err := openMembership(keys, site, own.newest)
		return events.Site{}, fmt.Errorf("site %s: %w: none of its site.membership events verifies (the newest, at stream sequence %d: %w), so the site's filters were not changed; publish the site's membership signed with a key of --controller-key (steward publish --signing-key)",
			site, ErrMembershipNotBelieved, seqOf(meta), err)
	}
	// The site's own keys are its verified membership of the highest
	// generation, as another site's are: anyone who may publish an event
	// can store a newer message on the site's subject, and one that does
	// not verify must neither change the site nor hold its set-up up. A
	// replayed older one loses to the generation the hub's consumer
	// records (events.SetupSite).
	m := *own.best
	mine := m.Claims()
	for _, other := range slices.Sorted(maps.Keys(reads)) {
		r := reads[other]
		if other == site || r.best == nil {
			continue
		}
		for _, claim := range r.best.Claims() {
			if slices.Contains(mine, claim) {
				return events.Site{}, fmt.Errorf("site %s: %w: %s is in site %s's membership (generation %d, stream sequence %d), and a key belongs to one site, so the site's filters were not changed; move it by publishing site %s's membership without it first, then run steward site setup %s and this again",
					site, ErrKeyClaimed, claim, other, r.best.Generation, r.bestSeq, other, other)
			}
		}
	}
	want := m.SiteOf(hubDomain)
	if err := receivedElsewhere(ctx, hubJS, want); err != nil {
		return events.Site{}, err
	}
	return want, nil
}

// receivedElsewhere refuses a key of s that another site set up at the hub
// receives now (its consumer's filters): the memberships say whose a key
// should be, the filters whose it is, and until that site is set up again
// without the key (its membership dropped it, or expired with the
// stream's retention), both would receive its events.
func receivedElsewhere(ctx context.Context, hubJS jetstream.JetStream, s events.Site) error {
	sites, err := listSites(ctx, hubJS)
	if err != nil {
		return fmt.Errorf("site %s: read the sites set up at the hub: %w", s.Name, err)
	}
	everySite := events.Site{}.EventSubjects()
	for _, other := range sites {
		if other.Name == s.Name {
			continue
		}
		for _, subject := range s.EventSubjects() {
			if !slices.Contains(everySite, subject) && slices.Contains(other.filters, subject) {
				return fmt.Errorf("site %s: %w: site %s's filters at the hub include %s, so it receives that key's events now, and the site's filters were not changed; set site %s up again from its membership without the key (steward site setup %s), then run this again",
					s.Name, ErrKeyClaimed, other.Name, subject, other.Name, other.Name)
			}
		}
	}
	return nil
}

// openMembership decodes, validates and verifies a membership message on
// the subject of site: the subject, the event's key and the signed site
// must all be site.
func openMembership(keys *signing.KeySet, site string, m jetstream.Msg) (events.Membership, error) {
	e, err := events.Decode(m.Headers(), m.Data())
	if err != nil {
		return events.Membership{}, err
	}
	if err := events.Validate(e); err != nil {
		return events.Membership{}, err
	}
	if e.Type() != events.TypeSiteMembership || e.Subject() != site {
		return events.Membership{}, fmt.Errorf("it is a %s for key %.70q on the subject of site %s (rule: binding)", e.Type(), e.Subject(), site)
	}
	var data events.SiteMembership
	if err := json.Unmarshal(e.Data(), &data); err != nil {
		return events.Membership{}, err
	}
	got, err := signing.OpenMembership(keys, data)
	if err != nil {
		var se *signing.StateError
		if errors.As(err, &se) {
			return got, fmt.Errorf("%w (rule: %s)", err, se.Rule)
		}
		return got, err
	}
	return got, nil
}

func seqOf(meta *jetstream.MsgMetadata) uint64 {
	if meta == nil {
		return 0
	}
	return meta.Sequence.Stream
}
