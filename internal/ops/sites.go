package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
	"github.com/steward-dev/steward/internal/streamread"
)

// SiteReadTimeout bounds reading one site's instances through the hub: a
// site whose link is cut usually answers "no responders" at once, but one
// whose link is slow must not hold the hub's status up.
const SiteReadTimeout = 5 * time.Second

// Site is what the hub knows of one site (docs/design.md §9): whether its
// leaf node is sourcing now, and how far behind it is, from the hub's
// durable consumer for it.
type Site struct {
	Name string `json:"name"`
	// Linked says the site's source is bound to the hub's consumer now:
	// its leaf node is linked and its stream is sourcing.
	Linked bool `json:"linked"`
	// Pending is how many of the site's events the hub holds and has not
	// sent it yet: during a cut, every event published for the site since.
	Pending uint64 `json:"pending"`
	// OldestPending is when the oldest of them was stored at the hub, and
	// OldestPendingSeconds its age: during a cut, about how long the site
	// has been behind. Unset when nothing is pending.
	OldestPending        *time.Time `json:"oldestPending,omitempty"`
	OldestPendingSeconds float64    `json:"oldestPendingSeconds,omitempty"`
	// Unconfirmed is how many were sent and not yet confirmed by the
	// site's flow control: stored at the site, or lost with a cut and sent
	// again when the site resets the consumer. Confirmations come in
	// windows, so a site that is caught up can show some.
	Unconfirmed int `json:"unconfirmed"`
	// Subjects is how many subjects the site receives (its keys, and the
	// two every site needs).
	Subjects int `json:"subjects"`
	// LastActive is when the site last took or acknowledged an event.
	LastActive *time.Time `json:"lastActive,omitempty"`
	// SilentSources are the hub's sources of the site's outcomes and dead
	// letters that have had no contact with it for DefaultStallAfter or
	// more: during a cut, all of them; while the site is linked, what
	// `steward site keep` restarts, its outcomes held at the site until
	// then.
	SilentSources []SilentSource `json:"silentSources,omitempty"`

	filters   []string
	delivered uint64
}

// SilentSource is one of the hub's sources of a site that has had no
// contact with it for a while.
type SilentSource struct {
	// Stream is the hub's stream that sources the site's of that name.
	Stream string `json:"stream"`
	// SilentSeconds is how long ago it last had contact with the site.
	SilentSeconds float64 `json:"silentSeconds"`
}

// readSilentSources sets each site's SilentSources from the hub's sources
// of it: one stream info request per stream, whatever the sites.
func readSilentSources(ctx context.Context, hub jetstream.JetStream, sites []Site) error {
	actives, err := siteSourceActivity(ctx, hub)
	if err != nil {
		return err
	}
	for i := range sites {
		for _, name := range siteStreams {
			// A source that has had no contact since the hub set it up
			// (a negative age) is not shown: nats-server does not say
			// since when, and every source is so for its first moment.
			if active, ok := actives[SiteSource{Site: sites[i].Name, Stream: name}]; ok && active >= DefaultStallAfter {
				sites[i].SilentSources = append(sites[i].SilentSources, SilentSource{Stream: name, SilentSeconds: active.Seconds()})
			}
		}
	}
	return nil
}

// siteOf is the site a consumer of the hub's STEWARD_EVENTS serves, when
// it is one events.SiteConsumerConfig made.
func siteOf(info *jetstream.ConsumerInfo) (Site, bool) {
	name, ok := events.SiteOfConsumer(info.Config)
	if !ok {
		return Site{}, false
	}
	return Site{Name: name, Linked: info.PushBound,
		Pending: info.NumPending, Unconfirmed: info.NumAckPending,
		Subjects:   len(info.Config.FilterSubjects),
		LastActive: latest(info.Delivered.Last, info.AckFloor.Last),
		filters:    info.Config.FilterSubjects, delivered: info.Delivered.Stream}, true
}

// readOldestPending sets when the oldest event held for the site and not
// sent to it yet was stored: the first message on the site's subjects
// after the consumer's delivered floor (every message up to the floor was
// sent, or is on no subject of the site's). It is cheap, and costs the
// same whatever the site's size: an ordered consumer from that sequence,
// on the site's subjects, reads that one message (create, fetch one,
// delete: a fixed few requests), and the server finds it through its
// per-subject index, skipping the blocks that hold none of the site's
// subjects, never reading the stream up to it. A direct get would be one
// request per subject: nats-server's next_by_subj takes one subject, and a
// site has one per key. Only a site with events pending costs anything.
func (s *Site) readOldestPending(ctx context.Context, hub jetstream.JetStream, now time.Time) error {
	if s.Pending == 0 || len(s.filters) == 0 {
		return nil
	}
	err := streamread.Each(ctx, hub, streamread.Range{Stream: events.StreamEvents, Subjects: s.filters, StartSeq: s.delivered + 1, Limit: 1},
		func(m jetstream.Msg) error {
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			t := meta.Timestamp.UTC()
			s.OldestPending, s.OldestPendingSeconds = &t, now.Sub(t).Seconds()
			return nil
		})
	if err != nil {
		return fmt.Errorf("site %s: the oldest event not sent to it: %w", s.Name, err)
	}
	return nil
}

// Sites lists the sites set up at this hub (`steward site setup`), one
// paged listing of STEWARD_EVENTS' consumers, and for each site that is
// behind, the age of the oldest event it has not been sent, and the hub's
// sources of it that are silent.
func Sites(ctx context.Context, js jetstream.JetStream) ([]Site, error) {
	out, err := listSites(ctx, js)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for i := range out {
		if err := out[i].readOldestPending(ctx, js, now); err != nil {
			return nil, err
		}
	}
	if err := readSilentSources(ctx, js, out); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Site) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// listSites reads the sites set up at the hub js from its consumers, in
// one paged listing, each with what its consumer says (not its oldest
// pending event).
func listSites(ctx context.Context, js jetstream.JetStream) ([]Site, error) {
	s, err := streamOrNone(ctx, js, events.StreamEvents)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, &NoStreamsError{Server: ServerURL(js)}
	}
	infos, err := listConsumers(ctx, s, events.StreamEvents)
	if err != nil {
		return nil, err
	}
	var out []Site
	for _, info := range infos {
		if site, ok := siteOf(info); ok {
			out = append(out, site)
		}
	}
	return out, nil
}

// SiteStatus is a site as the hub's `steward status` shows it: its link
// and lag, from the hub's consumer for it, and its worker instances, read
// from the site's own JetStream through the hub.
type SiteStatus struct {
	Site
	// Unreachable, when set, says why the site's instances could not be
	// read through the hub (its link is cut, its leaf node is down): what
	// they last reported is kept at the site, and the hub holds no copy,
	// so they are unknown until the link is back, never "none".
	Unreachable string `json:"unreachable,omitempty"`
	// Warning, when set, says what in the site's set-up risks a loss and
	// what to do meanwhile: its events stream written async
	// (events.CheckSiteEventsSynced).
	Warning string `json:"warning,omitempty"`
	InstanceSummary
}

// siteStatuses reads each site's instances through the hub, the sites at
// once, each bounded by SiteReadTimeout.
func siteStatuses(ctx context.Context, hub jetstream.JetStream, sites []Site, o StatusOptions, now time.Time) []SiteStatus {
	// The sources are the hub's own, read at the hub: a failure leaves
	// them unknown, and the rest of the status stands.
	_ = readSilentSources(ctx, hub, sites)
	out := make([]SiteStatus, len(sites))
	var wg sync.WaitGroup
	for i, s := range sites {
		out[i] = SiteStatus{Site: s, InstanceSummary: emptySummary()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, SiteReadTimeout)
			defer cancel()
			if err := out[i].Site.readOldestPending(sctx, hub, now); err != nil {
				// The lag's count stands without its age.
				out[i].OldestPending = nil
			}
			if err := out[i].readInstances(sctx, hub, o, now); err != nil {
				out[i].Unreachable = redact.Line(err.Error())
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b SiteStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// readInstances reads the instances of the site from its own JetStream,
// through the hub ($JS.<site>.API, with the operator's credentials): its
// consumers, its instances' status documents, verified as each instance's
// in the site's domain (docs/design.md §7) with the keys o.Docs believes,
// and its dead letters, summarised as the hub's own are; and its Warning.
func (s *SiteStatus) readInstances(ctx context.Context, hub jetstream.JetStream, o StatusOptions, now time.Time) error {
	nc := hub.Conn()
	if nc == nil {
		return errors.New("no connection to reach the site through")
	}
	js, err := events.JetStreamIn(nc, s.Name)
	if err != nil {
		return err
	}
	ev, err := js.Stream(ctx, events.StreamEvents)
	if err != nil {
		return fmt.Errorf("look up %s in domain %s: %w", events.StreamEvents, s.Name, err)
	}
	// A site whose events stream risks a loss says so beside its
	// instances: the configuration came with the stream they are read from.
	if err := events.CheckSiteEventsSynced(s.Name, ev.CachedInfo().Config); err != nil {
		s.Warning = err.Error()
	}
	byName := map[string]*Instance{}
	if _, err := listInstances(ctx, ev, byName); err != nil {
		return err
	}
	var docs *events.Store
	if o.Docs != nil {
		kv, err := js.KeyValue(ctx, events.CheckpointBucket)
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("open bucket %s in domain %s: %w", events.CheckpointBucket, s.Name, err)
		}
		if kv != nil {
			// Read-only, bound to the site's domain: a document copied
			// from the hub or another site does not verify here.
			docs = events.NewStore(kv, events.StoreOptions{Verifier: o.Docs.Verifier(), Domain: s.Name})
			docs.BindStream(ctx, js)
		}
	}
	if docs != nil || o.Docs == nil {
		if err := readStatusDocs(ctx, js, docs, o.Worker, byName); err != nil {
			return err
		}
	}
	if err := readDLQDepth(ctx, js, byName); err != nil {
		return err
	}
	proofs := ProofsOf(docs)
	if docs == nil && o.Docs != nil {
		proofs = Proofs{Verifier: o.Docs.Verifier(), Domain: s.Name}
	}
	sum, err := summarize(ctx, js, ev, byName, o, now, proofs)
	if err != nil {
		return err
	}
	s.InstanceSummary = sum
	return nil
}
