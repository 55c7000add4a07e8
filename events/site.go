package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultHubDomain is the JetStream domain a hub runs in when its
// operator names none: a site sources from the hub across the leaf link,
// and a source in another domain is addressed by that domain's name.
const DefaultHubDomain = "hub"

// CheckDomain refuses a JetStream domain that is not one subject token, as
// nats-server builds $JS.<domain>.API from it. It is the key's rule, so a
// site's name is also a safe file and server name.
func CheckDomain(domain string) error {
	if !isKey(domain) {
		return fmt.Errorf("JetStream domain %q: want one subject token, matching %s", domain, KeyPattern)
	}
	return nil
}

// JetStreamIn is the JetStream API of domain on nc. When the server nc is
// connected to is itself in domain (a worker at its site's leaf node) it is
// that server's own API, $JS.API: nats-server never lets it cross a link
// between domains, so it is the site's, and a worker's credentials, which
// allow $JS.API subjects, work at a site unchanged. Otherwise (a hub-side
// tool reaching a site) it is $JS.<domain>.API. An empty domain is the
// connected server's.
func JetStreamIn(nc *nats.Conn, domain string) (jetstream.JetStream, error) {
	if domain == "" || nc.ConnectedDomain() == domain {
		return jetstream.New(nc)
	}
	return jetstream.NewWithDomain(nc, domain)
}

// Site is one site of a fleet (docs/design.md §9): a NATS leaf node with
// its own JetStream domain, the keys of the hosts behind it, and the hub
// domain its events come from.
type Site struct {
	// Name is the site's JetStream domain and names its leaf node.
	Name string
	// HubDomain is the hub's JetStream domain, where STEWARD_EVENTS is
	// sourced from.
	HubDomain string
	// Boxes, Hives and Machines are the keys whose events the site
	// receives: join's boxes, credential's hives, provision's machines.
	Boxes, Hives, Machines []string
	// Generation is the generation of the signed membership the keys come
	// from (Membership.SiteOf), recorded on the hub's consumer; 0 for keys
	// given by hand, which keep the generation recorded before.
	Generation uint64
}

// Check refuses a site whose name or hub domain is no single subject token,
// whose name is its hub's, or whose keys are invalid or repeated.
func (s Site) Check() error {
	if err := CheckDomain(s.Name); err != nil {
		return fmt.Errorf("site name: %w", err)
	}
	if err := CheckDomain(s.HubDomain); err != nil {
		return fmt.Errorf("site %s: hub domain: %w", s.Name, err)
	}
	if s.Name == s.HubDomain {
		// Two JetStreams of one name across a leaf link answer each
		// other's requests; nats-server only guards some forms of it.
		return fmt.Errorf("site %s: its name is the hub's domain; a site's domain must differ from the hub's", s.Name)
	}
	for kind, keys := range map[string][]string{"box": s.Boxes, "hive": s.Hives, "machine": s.Machines} {
		seen := make(map[string]bool, len(keys))
		for _, k := range keys {
			if err := CheckKey(k); err != nil {
				return fmt.Errorf("site %s: %s: %w", s.Name, kind, err)
			}
			if seen[k] {
				return fmt.Errorf("site %s: %s %s is listed twice", s.Name, kind, k)
			}
			seen[k] = true
		}
	}
	return nil
}

// EventSubjects are the subjects of STEWARD_EVENTS a site receives: every
// site's (releases, host floors) and those of its own keys, sorted. Each is
// a literal subject, so no two overlap, and the hub's source consumer
// filters on exactly these.
func (s Site) EventSubjects() []string {
	subjects := []string{
		EventsPrefix + ".release.published",
		EventsPrefix + ".hostfloor.published",
	}
	for _, k := range s.Boxes {
		subjects = append(subjects, EventsPrefix+".invitation.written."+k)
	}
	for _, k := range s.Hives {
		subjects = append(subjects, EventsPrefix+".credential.rotated."+k)
	}
	for _, k := range s.Machines {
		subjects = append(subjects, EventsPrefix+".grant.changed."+k)
	}
	slices.Sort(subjects)
	return slices.Compact(subjects)
}

// SiteLinkDenied are the subjects a site's leaf link carries in neither
// direction: all of Steward's. Events, outcomes and dead letters cross only
// as JetStream sourcing (the $JS subjects), so a publish is stored and
// acknowledged by one stream; stored notices and control messages are each
// side's own, so the hub's notices never wake a site's reader for an event
// it does not hold yet.
func SiteLinkDenied() []string { return []string{"steward.>"} }

// SiteConsumer is the name of the durable consumer the hub's
// STEWARD_EVENTS keeps for site: what the site's STEWARD_EVENTS sources
// through, so the hub holds each site's position (its lag is the
// consumer's pending count) and a site coming back resets it rather than
// creating one afresh.
func SiteConsumer(site string) string { return "site-" + site }

// sitePrefix begins every subject that crosses a site's link for that
// site alone: outside steward.>, which the link does not carry, and named
// per site, so a site's leaf identity is allowed its own and no other
// site's (internal/natsauth).
const sitePrefix = "_STEWARD_SITE."

// SiteDeliverSubject is where the hub's consumer for site delivers the
// site's events (and its heartbeats and flow control requests).
func SiteDeliverSubject(site string) string { return sitePrefix + site + ".events" }

// SiteSourcedSubject is where site's durable consumer of its stream
// (STEWARD_OUTCOMES or STEWARD_DLQ) delivers to the hub's source
// (HubSiteSource), where an ephemeral source would use $JS.S.<id>, a
// subject of no site that every site's leaf would have to be allowed.
func SiteSourcedSubject(site, stream string) string {
	return sitePrefix + site + ".sourced." + stream
}

// HubSourceConsumer is the name of the durable consumer a site's
// STEWARD_OUTCOMES and STEWARD_DLQ each keep for the hub's source. The hub
// only resets it, a request that names it, so the link carries no
// consumer creation, whose body would be a whole consumer configuration
// (docs/design.md §7, reflection across the link).
const HubSourceConsumer = "hub"

// HubSourceConsumerConfig is site's durable consumer of stream for the
// hub's source: from the first message, acknowledged by flow control, as
// nats-server's durable sourcing requires.
func HubSourceConsumerConfig(stream, site string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        HubSourceConsumer,
		Description:    "site " + site + "'s " + stream + ", sourced by the hub",
		DeliverSubject: SiteSourcedSubject(site, stream),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckFlowControlPolicy,
		FlowControl:    true,
		IdleHeartbeat:  time.Second,
		MaxAckPending:  siteMaxAckPending,
	}
}

// SiteInboxPrefix is the inbox prefix of a hub-side connection reading
// site's JetStream (`--js-domain site`, the default there): the site's
// answers cross the link to it, and a site's leaf identity may answer
// under its own prefix only, never into another identity's inbox.
func SiteInboxPrefix(site string) string { return sitePrefix + site + ".inbox" }

// SiteConsumerConfig is the hub's durable consumer for site s: filtered to
// the site's subjects, from the first event kept, acknowledged by flow
// control, as nats-server's durable sourcing requires (2.14 or later).
func SiteConsumerConfig(s Site) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        SiteConsumer(s.Name),
		Description:    "the events of site " + s.Name + ", sourced by its leaf node",
		DeliverSubject: SiteDeliverSubject(s.Name),
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckPolicy:      jetstream.AckFlowControlPolicy,
		FlowControl:    true,
		// nats-server requires the sourcing heartbeat, one second.
		IdleHeartbeat:  time.Second,
		MaxAckPending:  siteMaxAckPending,
		FilterSubjects: s.EventSubjects(),
		Metadata:       s.consumerMetadata(),
	}
}

// consumerMetadata records the membership generation the site's filters
// come from, so the next set-up can refuse one lower (no rollback).
func (s Site) consumerMetadata() map[string]string {
	if s.Generation == 0 {
		return nil
	}
	return map[string]string{MembershipGenerationKey: strconv.FormatUint(s.Generation, 10)}
}

// SiteOfConsumer returns the site a consumer of the hub's STEWARD_EVENTS
// serves, when it is one SiteConsumerConfig made.
func SiteOfConsumer(cfg jetstream.ConsumerConfig) (string, bool) {
	site, ok := strings.CutPrefix(cfg.Durable, "site-")
	if !ok || CheckDomain(site) != nil || cfg.DeliverSubject != SiteDeliverSubject(site) {
		return "", false
	}
	return site, true
}

// siteMaxAckPending bounds what the hub sends a site ahead of its flow
// control: a catch-up after a cut streams in windows of this many events.
const siteMaxAckPending = 10_000

// SiteStreamConfigs are a site's three streams, in its own domain, with
// c's limits. STEWARD_EVENTS has no subjects of its own: it only sources
// the hub's, through the hub's consumer for the site (SiteConsumerConfig,
// filtered to the site's subjects), so a publish to steward.events.> is
// stored (and acknowledged) at the hub alone, and the stored notices
// stream-reading workers wake on are republished at the site when an event
// arrives there. Outcomes and dead letters are written at the site, where
// its workers are, and sourced by the hub (HubSiteSource).
func SiteStreamConfigs(c StreamConfig, s Site) []jetstream.StreamConfig {
	configs := c.StreamConfigs()
	for i := range configs {
		sc := &configs[i]
		if sc.Name != StreamEvents {
			sc.Description += ", at site " + s.Name
			continue
		}
		sc.Subjects = nil
		sc.Sources = []*jetstream.StreamSource{{
			Name: StreamEvents, Domain: s.HubDomain,
			Consumer: &jetstream.StreamConsumerSource{Name: SiteConsumer(s.Name), DeliverSubject: SiteDeliverSubject(s.Name)},
		}}
		sc.Description = "Steward state changes for site " + s.Name + ", sourced from the hub"
		// Written as every other stream is (synced, with the server's
		// sync_interval: always), not with persist_mode: async: the leaf
		// answers the hub's flow control with the last event it took in,
		// and the hub's consumer counts everything up to it acknowledged.
		// A leaf that started again sends nats-server's reset for a
		// durable source, which carries no sequence, so the hub goes on
		// from its ack floor. An async tail lost in a kill (or a power
		// cut) sat below that floor and was never sent again: six events
		// of a SIGKILLed catch-up never reached the site
		// (TestSitesBenchSurvivesTheLeafKilledInTheCatchUp).
	}
	return configs
}

// HubSiteSource is the source a hub stream (STEWARD_OUTCOMES or
// STEWARD_DLQ) takes from the stream of the same name at site, through
// the site's durable consumer for it (HubSourceConsumerConfig).
func HubSiteSource(stream, site string) *jetstream.StreamSource {
	return &jetstream.StreamSource{
		Name:     stream,
		External: &jetstream.ExternalStream{APIPrefix: domainAPIPrefix(site)},
		Consumer: &jetstream.StreamConsumerSource{Name: HubSourceConsumer, DeliverSubject: SiteSourcedSubject(site, stream)},
	}
}

// domainAPIPrefix is the JetStream API prefix of domain, as nats.go writes
// a source's Domain into its External on creation: what a stream read back
// from the server carries.
func domainAPIPrefix(domain string) string { return "$JS." + domain + ".API" }

// SiteOf returns the site a hub stream's source comes from, when it is one
// HubSiteSource made.
func SiteOf(src *jetstream.StreamSource, stream string) (string, bool) {
	if src == nil || src.Name != stream || src.External == nil {
		return "", false
	}
	return apiPrefixDomain(src.External.APIPrefix)
}

// SetupSite creates or updates a site's streams and checkpoint bucket in
// its domain (siteJS), with cfg's limits, and adds the site's outcomes and
// dead letters to the hub's streams as sources (hubJS). It is the
// operator's act (`steward site setup`); the hub's own streams must exist
// (`steward setup` at the hub).
func SetupSite(ctx context.Context, siteJS, hubJS jetstream.JetStream, cfg BusConfig, s Site) error {
	if err := s.Check(); err != nil {
		return err
	}
	if err := cfg.Streams.Check(); err != nil {
		return err
	}
	if cfg.CheckpointMaxBytes < 1 || cfg.CheckpointMaxValueSize < 1 {
		return fmt.Errorf("checkpoint max bytes %d and max value size %d: want both positive", cfg.CheckpointMaxBytes, cfg.CheckpointMaxValueSize)
	}
	if err := keepGenerationFloor(ctx, hubJS, &s); err != nil {
		return err
	}
	// The hub's consumer first: the site's source resets it, and finds
	// nothing to reset before it exists.
	if _, err := hubJS.CreateOrUpdatePushConsumer(ctx, StreamEvents, SiteConsumerConfig(s)); err != nil {
		return fmt.Errorf("site %s: create or update the hub's consumer %s: %w", s.Name, SiteConsumer(s.Name), describeCreateError(err))
	}
	for _, sc := range SiteStreamConfigs(cfg.Streams, s) {
		if err := keepPersistMode(ctx, siteJS, &sc); err != nil {
			return fmt.Errorf("site %s: %w", s.Name, err)
		}
		if _, err := siteJS.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("site %s: create or update stream %s: %w", s.Name, sc.Name, describeCreateError(err))
		}
	}
	if _, err := siteJS.CreateOrUpdateKeyValue(ctx, cfg.bucketConfig()); err != nil {
		return fmt.Errorf("site %s: create or update KV bucket %s: %w", s.Name, CheckpointBucket, describeCreateError(err))
	}
	for _, name := range []string{StreamOutcomes, StreamDLQ} {
		// The site's consumer first: the hub's source resets it.
		if _, err := siteJS.CreateOrUpdatePushConsumer(ctx, name, HubSourceConsumerConfig(name, s.Name)); err != nil {
			return fmt.Errorf("site %s: create or update the consumer %s of its %s for the hub: %w", s.Name, HubSourceConsumer, name, describeCreateError(err))
		}
		if err := addHubSource(ctx, hubJS, name, s.Name); err != nil {
			return err
		}
	}
	return nil
}

// keepPersistMode gives sc the persist mode of the stream of its name
// already at the site, if there is one: nats-server refuses to change a
// stream's persist mode, and a site set up before its events stream was
// synced (persist_mode: async) would otherwise fail every set-up after,
// membership changes included. Such a site keeps working as it did, and
// keeps the loss a kill of its leaf can cause in a catch-up
// (SiteStreamConfigs), which CheckSiteEventsSynced tells the operator of;
// moving it to a synced stream is not built yet (docs/design.md,
// "Catch-up rate").
func keepPersistMode(ctx context.Context, siteJS jetstream.JetStream, sc *jetstream.StreamConfig) error {
	st, err := siteJS.Stream(ctx, sc.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read stream %s for the persist mode it was made with: %w", sc.Name, err)
	}
	sc.PersistMode = st.CachedInfo().Config.PersistMode
	return nil
}

// ErrSiteEventsAsync says a site's STEWARD_EVENTS is written with
// persist_mode async, as set-ups made it for a while: the site's leaf node
// confirms events to the hub before they are on its disk, so a kill of it
// while it catches up can lose events the hub will not send again
// (SiteStreamConfigs).
var ErrSiteEventsAsync = errors.New("the site's events stream is written async")

// CheckSiteEventsSynced returns an error wrapping ErrSiteEventsAsync when
// site's STEWARD_EVENTS, configured as cfg (read in the site's domain), is
// written async, as an earlier set-up made it and SetupSite keeps it
// (keepPersistMode), so that the operator learns of the loss it risks
// from `steward site setup` and `steward status`, not from a lost event.
func CheckSiteEventsSynced(site string, cfg jetstream.StreamConfig) error {
	if cfg.PersistMode != jetstream.AsyncPersistMode {
		return nil
	}
	return fmt.Errorf("site %s: %w: its %s was made with persist_mode async by an earlier set-up, and nats-server cannot change a stream's persist mode, so a kill of the site's leaf node while it catches up after a cut can lose events the hub will not send again; stop the leaf node with SIGTERM, which writes what it holds, never SIGKILL; moving the site to a synced stream is not built yet",
		site, ErrSiteEventsAsync, StreamEvents)
}

// ErrMembershipRollback says a membership's generation is lower than the
// one the site's filters were set up from.
var ErrMembershipRollback = errors.New("membership generation lower than the one applied")

// keepGenerationFloor reads the generation the hub's consumer for s
// records: a membership below it is refused (an old signed membership,
// replayed, would hand keys back to a site they were moved from), and keys
// given by hand (generation 0) keep it, so an unsigned set-up does not
// lower the floor a signed one set.
func keepGenerationFloor(ctx context.Context, hubJS jetstream.JetStream, s *Site) error {
	c, err := hubJS.PushConsumer(ctx, StreamEvents, SiteConsumer(s.Name))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("site %s: read the hub's consumer %s for the membership generation it records: %w", s.Name, SiteConsumer(s.Name), err)
	}
	applied := AppliedGeneration(c.CachedInfo().Config)
	switch {
	case s.Generation == 0:
		s.Generation = applied
	case s.Generation < applied:
		return fmt.Errorf("site %s: %w: the membership found is generation %d and the site's filters were set up from generation %d (the hub's consumer %s records it), so the site's filters were not changed; publish the site's membership again with a generation above %d", s.Name, ErrMembershipRollback, s.Generation, applied, SiteConsumer(s.Name), applied)
	}
	return nil
}

// addHubSource adds the site's stream of the same name to the hub's stream
// name as a source, keeping every other source and setting.
func addHubSource(ctx context.Context, hubJS jetstream.JetStream, name, site string) error {
	st, err := hubJS.Stream(ctx, name)
	if err != nil {
		return fmt.Errorf("site %s: the hub's stream %s: %w; create the hub's streams first with `steward setup` at the hub", site, name, err)
	}
	cfg := st.CachedInfo().Config
	want := HubSiteSource(name, site)
	found := false
	for i, src := range cfg.Sources {
		if got, ok := SiteOf(src, name); ok && got == site {
			if src.Consumer != nil && *src.Consumer == *want.Consumer {
				return nil
			}
			// A source set up before the site's durable consumer creates
			// one of its own at the site, which the site's leaf identity
			// does not carry: replaced in place. The hub sources the
			// site's stream again from its start through the durable
			// consumer; what its duplicate window still holds is dropped.
			cfg.Sources[i], found = want, true
		}
	}
	if !found {
		cfg.Sources = append(cfg.Sources, want)
	}
	if _, err := hubJS.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("site %s: add the site's %s as a source of the hub's: %w", site, name, describeCreateError(err))
	}
	return nil
}

// restartPutBackTimeout bounds putting a source back in
// RestartHubSiteSource, which does not stop with its context.
const restartPutBackTimeout = 30 * time.Second

// ErrNoSiteSource says a hub stream has no source for the site named.
var ErrNoSiteSource = errors.New("no source for the site")

// RestartHubSiteSource restarts the hub's source of site's stream of the
// same name (STEWARD_OUTCOMES or STEWARD_DLQ): it takes the source out of
// the hub stream's configuration and puts it back as it was, two updates,
// because nats-server has no request that restarts one source. A source
// whose reset request was in flight when its site's link came back is not
// retried by the relink, and one that failed through a cut waits out a
// backoff of up to two minutes; put back, it is a new source that asks the
// site's durable consumer for a reset at once (docs/design.md §9).
//
// Nothing is sent twice: the site's consumer goes on from what the hub
// confirmed, nats-server recovers the source's last sequence from the
// messages the stream holds (a scan of the stream, once), and the hub's
// duplicate window drops what it still holds. Between the two updates, a
// reader at the hub that reads the configuration finds no source for the
// site, so for that moment its sourced messages verify in the hub's
// domain and are not believed. If the source cannot be put back, the
// error says so: `steward site setup` puts it back.
func RestartHubSiteSource(ctx context.Context, hubJS jetstream.JetStream, stream, site string) error {
	st, err := hubJS.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("site %s: read the hub's stream %s to restart its source: %w", site, stream, err)
	}
	cfg := st.CachedInfo().Config
	i := slices.IndexFunc(cfg.Sources, func(src *jetstream.StreamSource) bool {
		got, ok := SiteOf(src, stream)
		return ok && got == site
	})
	if i < 0 {
		return fmt.Errorf("site %s: %w: the hub's %s does not source the site's, so there is nothing to restart; `steward site setup %s` adds it", site, ErrNoSiteSource, stream, site)
	}
	without := cfg
	without.Sources = slices.Delete(slices.Clone(cfg.Sources), i, i+1)
	if _, err := hubJS.UpdateStream(ctx, without); err != nil {
		return fmt.Errorf("site %s: take the site's source out of the hub's %s to restart it: %w; the source was left as it was", site, stream, describeCreateError(err))
	}
	// Put back even when ctx ends between the two updates (a keeper
	// stopped by a signal): a source left out is the worse state.
	back, cancel := context.WithTimeout(context.WithoutCancel(ctx), restartPutBackTimeout)
	defer cancel()
	if _, err := hubJS.UpdateStream(back, cfg); err != nil {
		return fmt.Errorf("site %s: put the site's source back into the hub's %s after taking it out to restart it: %w; the hub does not source the site's %s until `steward site setup %s` puts it back (the site holds it meanwhile)", site, stream, describeCreateError(err), stream, site)
	}
	return nil
}
