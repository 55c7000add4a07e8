package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// DefaultStallAfter is how long a SourceKeeper lets a linked site's source
// go without contact before it restarts it: ten heartbeats of the site's
// consumer (one a second), and the interval nats-server itself checks its
// sources at.
const DefaultStallAfter = 10 * time.Second

// SourceKeeper restarts the hub's sources of a site's outcomes and dead
// letters when they have stalled while the site is linked (docs/design.md
// §9). nats-server does not retry a source whose request was in flight
// when the link came back, and retries one that failed through a cut with
// a backoff of up to two minutes: without a keeper, a site's outcomes
// reach the hub that much later (never lost: the site holds them).
//
// It is a reconciler: Keep looks at what the hub reports now and acts on
// it, so a missed pass or a restarted keeper loses nothing. It remembers
// only when it saw things begin, which the hub does not report, and what
// it restarted last.
type SourceKeeper struct {
	hub        jetstream.JetStream
	stallAfter time.Duration
	now        func() time.Time

	// linkedSince is when the keeper first saw a site linked while one of
	// its sources was silent: the relink's own retry is given stallAfter
	// before the keeper steps in.
	linkedSince map[string]time.Time
	// silentSince is when the keeper first saw a source that has had no
	// contact since nats-server set it up (it reports no age for that).
	silentSince map[SiteSource]time.Time
	// restarted is when the keeper last restarted each source, and how
	// many times since it was last in contact.
	restarted map[SiteSource]restart
}

// restart is the keeper's record of restarting one source.
type restart struct {
	at    time.Time
	count int
}

// maxRestartBackoff bounds how far apart, in stall times, the keeper
// restarts a source its restarts have not brought back: each restart
// scans the hub's stream once, and a source that stays silent through
// them (its site's consumer gone) must not cost that every few seconds
// for as long as the hub runs. 16 stall times is 160 s by default, a
// little over nats-server's own backoff.
const maxRestartBackoff = 16

// wait is how long after this restart the next may come: the stall time,
// doubling with each restart that did not bring the source back.
func (r restart) wait(stall time.Duration) time.Duration {
	return stall * time.Duration(min(1<<max(r.count-1, 0), maxRestartBackoff))
}

// SiteSource is one of the hub's sources of a site: its stream
// (STEWARD_OUTCOMES or STEWARD_DLQ) from the site's stream of that name.
type SiteSource struct {
	Site   string `json:"site"`
	Stream string `json:"stream"`
}

// SourceRestart is what one pass of a SourceKeeper did to a source.
type SourceRestart struct {
	SiteSource
	// Silent is how long the source had had no contact with the site.
	Silent time.Duration `json:"silent"`
	// Err is why the restart failed; nil when it was restarted.
	Err error `json:"-"`
}

// KeeperOption configures a SourceKeeper.
type KeeperOption func(*SourceKeeper)

// WithStallAfter sets how long a linked site's source may go without
// contact, and the site be linked, before the keeper restarts it, and how
// long it leaves a source it restarted before restarting it again, a time
// that doubles with each restart that does not bring the source back, up
// to 16 times it (DefaultStallAfter).
func WithStallAfter(d time.Duration) KeeperOption {
	return func(k *SourceKeeper) { k.stallAfter = d }
}

// NewSourceKeeper returns a keeper of the sources of the hub hub, whose
// JetStream it reads and whose streams it updates (the operator's
// identity, as `steward site setup` needs).
func NewSourceKeeper(hub jetstream.JetStream, opts ...KeeperOption) (*SourceKeeper, error) {
	k := &SourceKeeper{hub: hub, stallAfter: DefaultStallAfter, now: time.Now,
		linkedSince: map[string]time.Time{}, silentSince: map[SiteSource]time.Time{}, restarted: map[SiteSource]restart{}}
	for _, o := range opts {
		o(k)
	}
	if k.stallAfter <= 0 {
		return nil, fmt.Errorf("stall after %v: want a positive duration", k.stallAfter)
	}
	return k, nil
}

// siteStreams are the hub's streams that source each site's.
var siteStreams = []string{events.StreamOutcomes, events.StreamDLQ}

// Keep makes one pass: it reads the hub's sources of every site, and
// restarts each that has had no contact for the stall time while its site
// has been linked as long, unless it restarted it within that time (or,
// when its restarts have not brought it back, within the doubled time). It
// returns what it restarted, each with its error if the restart failed,
// and an error if the hub could not be read. A healthy hub costs it one
// stream info request per stream.
func (k *SourceKeeper) Keep(ctx context.Context) ([]SourceRestart, error) {
	now := k.now()
	actives, err := siteSourceActivity(ctx, k.hub)
	if err != nil {
		return nil, err
	}
	silent := map[SiteSource]time.Duration{}
	for src, active := range actives {
		d := k.silence(src, active, now)
		switch {
		case d >= k.stallAfter:
			silent[src] = d
		case active >= 0:
			// In contact: its restarts, if any, brought it back.
			delete(k.restarted, src)
		}
	}
	k.forgetAllBut(silent)
	var out []SourceRestart
	linked := map[string]bool{}
	for src, d := range silent {
		ok, seen := linked[src.Site]
		if !seen {
			var err error
			if ok, err = k.linkedLongEnough(ctx, src.Site, now); err != nil {
				return out, err
			}
			linked[src.Site] = ok
		}
		last, restarted := k.restarted[src]
		if !ok || (restarted && now.Sub(last.at) < last.wait(k.stallAfter)) {
			continue
		}
		k.restarted[src] = restart{at: now, count: last.count + 1}
		delete(k.silentSince, src)
		err := events.RestartHubSiteSource(ctx, k.hub, src.Stream, src.Site)
		out = append(out, SourceRestart{SiteSource: src, Silent: d, Err: err})
	}
	return out, nil
}

// siteSourceActivity reads, for each of the hub's sources of a site, how
// long ago it last had contact with the site, as the hub reports it (a
// negative age: none since nats-server set the source up): one stream
// info request per stream.
func siteSourceActivity(ctx context.Context, hub jetstream.JetStream) (map[SiteSource]time.Duration, error) {
	out := map[SiteSource]time.Duration{}
	for _, name := range siteStreams {
		st, err := hub.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read the hub's %s for its sources: %w", name, err)
		}
		for _, si := range st.CachedInfo().Sources {
			if site, ok := events.SiteOf(&jetstream.StreamSource{Name: si.Name, External: si.External}, name); ok {
				out[SiteSource{Site: site, Stream: name}] = si.Active
			}
		}
	}
	return out, nil
}

// silence is how long src has had no contact with its site: what the hub
// reports, or, for a source that has had none since it was set up (the
// hub reports a negative age), since the keeper first saw it so.
func (k *SourceKeeper) silence(src SiteSource, active time.Duration, now time.Time) time.Duration {
	if active >= 0 {
		delete(k.silentSince, src)
		return active
	}
	since, ok := k.silentSince[src]
	if !ok {
		k.silentSince[src] = now
		return 0
	}
	return now.Sub(since)
}

// forgetAllBut drops what the keeper remembers of sites whose sources are
// all in contact again, so that the next silence starts its own clock.
func (k *SourceKeeper) forgetAllBut(silent map[SiteSource]time.Duration) {
	sites := map[string]bool{}
	for src := range silent {
		sites[src.Site] = true
	}
	for site := range k.linkedSince {
		if !sites[site] {
			delete(k.linkedSince, site)
		}
	}
}

// linkedLongEnough says whether site has been linked, as the keeper has
// seen it, for the stall time: the hub's consumer for the site's events is
// push-bound (Site.Linked). A site that is cut is left alone: restarting
// its sources gains nothing until its link is back.
func (k *SourceKeeper) linkedLongEnough(ctx context.Context, site string, now time.Time) (bool, error) {
	c, err := k.hub.PushConsumer(ctx, events.StreamEvents, events.SiteConsumer(site))
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// A source with no consumer for the site's events: set up by
		// hand or half-removed. Its link cannot be told, so it is not
		// touched.
		delete(k.linkedSince, site)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("site %s: read the hub's consumer %s to tell whether the site is linked: %w", site, events.SiteConsumer(site), err)
	}
	if !c.CachedInfo().PushBound {
		delete(k.linkedSince, site)
		return false, nil
	}
	since, ok := k.linkedSince[site]
	if !ok {
		k.linkedSince[site] = now
		return false, nil
	}
	return now.Sub(since) >= k.stallAfter, nil
}

// Run calls Keep every interval until ctx ends, and tells report what each
// pass restarted, and any error reading the hub (the next pass tries
// again). It returns ctx's error.
func (k *SourceKeeper) Run(ctx context.Context, interval time.Duration, report func([]SourceRestart, error)) error {
	if interval <= 0 {
		return fmt.Errorf("interval %v: want a positive duration", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		restarts, err := k.Keep(ctx)
		// What a pass restarted is reported even when ctx ended in it: a
		// restart is a change to the hub's stream, never left unlogged.
		if len(restarts) > 0 {
			report(restarts, nil)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			report(nil, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
