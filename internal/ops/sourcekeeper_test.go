package ops_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/sitetest"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/workers/workertest"
)

// hubSource is what the hub reports of its source of the site's stream.
func hubSource(t *testing.T, hub jetstream.JetStream, stream string) *jetstream.StreamSourceInfo {
	t.Helper()
	s, err := hub.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	for _, si := range s.CachedInfo().Sources {
		if site, ok := events.SiteOf(&jetstream.StreamSource{Name: si.Name, External: si.External}, stream); ok && site == "site-a" {
			return si
		}
	}
	t.Fatalf("the hub's %s has no source of site-a: %+v", stream, s.CachedInfo().Sources)
	return nil
}

// outcomesAtHub counts the hub's outcomes of the site's instance by the
// event they answer.
func outcomesAtHub(t *testing.T, hub jetstream.JetStream) map[string]int {
	t.Helper()
	out := map[string]int{}
	err := streamread.Each(context.Background(), hub, streamread.Range{Stream: events.StreamOutcomes, Subjects: []string{events.OutcomeSubject("credential", siteHive)}},
		func(m jetstream.Msg) error {
			e, err := events.Decode(m.Headers(), m.Data())
			if err != nil {
				return err
			}
			cause, _ := e.Extensions()["causationid"].(string)
			out[cause]++
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// silentSources is what `steward site status` at the hub says of site-a's
// sources.
func silentSources(t *testing.T, hub jetstream.JetStream) []ops.SilentSource {
	t.Helper()
	sites, err := ops.Sites(context.Background(), hub)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		if s.Name == "site-a" {
			return s.SilentSources
		}
	}
	t.Fatalf("the hub lists no site-a: %+v", sites)
	return nil
}

// keepUntil runs k's passes, as Run does, until one restarts something,
// and returns what it restarted; it fails the test if none did within a
// minute.
func keepUntil(t *testing.T, k *ops.SourceKeeper) []ops.SourceRestart {
	t.Helper()
	var restarts []ops.SourceRestart
	workertest.WaitUntil(t, "the keeper restarts a source", func() bool {
		var err error
		restarts, err = k.Keep(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return len(restarts) > 0
	})
	return restarts
}

// A source of a site's outcomes that hears nothing while the site is
// linked is restarted by the keeper once the site has been linked, and the
// source silent, for the stall time; the site's outcomes reach the hub
// through it, each once. A healthy source and the sources of a cut site
// are left alone, and a source just restarted is given the stall time.
func TestSourceKeeperRestartsAStalledSiteSource(t *testing.T) {
	ls := startLiveSite(t)
	ctx := context.Background()
	// The site's consumer for the hub heartbeats every second, so a
	// healthy source's silence reaches a second before each heartbeat, and
	// more on a loaded machine: at a stall time of 1 s a CI run saw the
	// keeper restart the healthy dead letters' source, silent 1.001 s. The
	// default is ten heartbeats; this is two and a half.
	const stall = 2500 * time.Millisecond
	// The keeper's clock runs with the real one, and a test moves it on
	// where it must look again a stall later.
	var ahead atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	k, err := ops.NewSourceKeeper(ls.hub, ops.WithStallAfter(stall), ops.WithClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	publishTraced(t, ls.hub, siteHive, 1, "")
	first := fmt.Sprintf("rot-%s-1", siteHive)
	workertest.WaitUntil(t, "the site's first outcome is at the hub", func() bool { return outcomesAtHub(t, ls.hub)[first] == 1 })

	// Healthy: nothing to do, however often it looks, and the hub's
	// status says it hears from the site.
	for range 3 {
		if restarts, err := k.Keep(ctx); err != nil || len(restarts) != 0 {
			t.Fatalf("the keeper restarted %+v (%v) while the site's sources were in contact; want nothing", restarts, err)
		}
	}
	if silent := silentSources(t, ls.hub); len(silent) != 0 {
		t.Errorf("steward site status shows silent sources %+v of a healthy site; want none", silent)
	}

	// Cut: the sources fall silent, but restarting them gains nothing
	// until the link is back.
	ls.pair.Cut()
	workertest.WaitUntil(t, "the hub's source of the site's outcomes falls silent", func() bool {
		return hubSource(t, ls.hub, events.StreamOutcomes).Active > 2*stall
	})
	for range 3 {
		if restarts, err := k.Keep(ctx); err != nil || len(restarts) != 0 {
			t.Fatalf("the keeper restarted %+v (%v) while the site was cut; want nothing", restarts, err)
		}
		ahead.Add(int64(2 * stall))
	}
	// The hub's status names both of the cut site's sources as silent
	// once they have been for ops.DefaultStallAfter.
	workertest.WaitUntil(t, "steward site status shows both of the cut site's sources silent", func() bool {
		silent := silentSources(t, ls.hub)
		return len(silent) == 2 && silent[0].Stream == events.StreamOutcomes && silent[1].Stream == events.StreamDLQ &&
			silent[0].SilentSeconds >= ops.DefaultStallAfter.Seconds() && silent[1].SilentSeconds >= ops.DefaultStallAfter.Seconds()
	})
	// The link back: nats-server's relink retries the sources (both were
	// in contact 3.5 s after it, without a keeper), and the keeper,
	// passing as Run does, may restart one still silent when the site has
	// been linked its stall time, shorter here than that retry: each
	// restart must be of a source silent that long, and must succeed.
	ls.pair.Restart()
	var afterRelink []ops.SourceRestart
	workertest.WaitUntil(t, "both of the hub's sources of the site are in contact after the relink", func() bool {
		restarts, err := k.Keep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		afterRelink = append(afterRelink, restarts...)
		for _, stream := range []string{events.StreamOutcomes, events.StreamDLQ} {
			if a := hubSource(t, ls.hub, stream).Active; a < 0 || a >= stall {
				return false
			}
		}
		return true
	})
	for _, r := range afterRelink {
		if r.Err != nil || r.Silent < stall {
			t.Errorf("after the relink the keeper restarted %+v; want a source silent the stall time or more, without error", r)
		}
		t.Logf("after the relink the keeper restarted the hub's source of %s's %s, silent %v", r.Site, r.Stream, r.Silent.Round(time.Millisecond))
	}

	// The stall: the site's consumer for the hub goes (as a site's store
	// lost, or a hand's mistake, would take it), so the hub's source hears
	// nothing while the site is linked. The keeper restarts it once the
	// site has been linked, and the source silent, for the stall time.
	if err := ls.site.DeleteConsumer(ctx, events.StreamOutcomes, events.HubSourceConsumer); err != nil {
		t.Fatal(err)
	}
	restarts := keepUntil(t, k)
	if len(restarts) != 1 || restarts[0].Site != "site-a" || restarts[0].Stream != events.StreamOutcomes || restarts[0].Err != nil {
		t.Fatalf("the keeper restarted %+v; want the hub's source of site-a's %s alone, without error", restarts, events.StreamOutcomes)
	}
	if restarts[0].Silent < stall {
		t.Errorf("the keeper says the source was silent for %v; want at least the stall time %v", restarts[0].Silent, stall)
	}
	// Restarted, it is left the stall time before another restart (the
	// consumer is still gone, so the source is still silent), and it is
	// in the hub's configuration again, as the readers need.
	if restarts, err := k.Keep(ctx); err != nil || len(restarts) != 0 {
		t.Errorf("right after a restart the keeper restarted %+v (%v); want nothing", restarts, err)
	}
	hubSource(t, ls.hub, events.StreamOutcomes)

	// Restarts that do not bring it back (the consumer is still gone)
	// come further and further apart: each scans the hub's stream, and a
	// keeper must not do that every few seconds for as long as the hub
	// runs. Over 30 stall times of the keeper's clock, passes half a stall
	// apart: without the doubling a restart comes every 2 to 3 stall
	// times (each waits for the new source's silence and the site's link
	// to be seen anew); with it, the fourth gap is 8 stall times or more.
	at := []time.Time{clock()}
	for range 60 {
		ahead.Add(int64(stall / 2))
		restarts, err := k.Keep(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range restarts {
			if r.SiteSource != (ops.SiteSource{Site: "site-a", Stream: events.StreamOutcomes}) || r.Err != nil {
				t.Fatalf("the keeper restarted %+v; want only the silent source of site-a's %s, without error", r, events.StreamOutcomes)
			}
			at = append(at, clock())
		}
	}
	if len(at) < 5 || len(at) > 7 {
		t.Fatalf("the keeper restarted a source its restarts did not bring back %d times over 30 stall times (at %v); want 4 to 6, further apart each time", len(at)-1, at)
	}
	for i := 1; i < len(at); i++ {
		if gap, least := at[i].Sub(at[i-1]), stall*time.Duration(min(1<<(i-1), 16)); gap < least {
			t.Errorf("restart %d came %v after the one before; want at least %v", i+1, gap, least)
		}
	}

	// The consumer is made again, as `steward site setup` makes it, and
	// the site writes an outcome; with the keeper running, it reaches the
	// hub, and every outcome is there once.
	if _, err := ls.site.CreateOrUpdatePushConsumer(ctx, events.StreamOutcomes, events.HubSourceConsumerConfig(events.StreamOutcomes, ls.pair.Site)); err != nil {
		t.Fatal(err)
	}
	publishTraced(t, ls.hub, siteHive, 3, "")
	third := fmt.Sprintf("rot-%s-3", siteHive)
	workertest.WaitUntil(t, "the outcome of version 3 is at the hub, the keeper running", func() bool {
		if _, err := k.Keep(ctx); err != nil {
			t.Fatal(err)
		}
		return outcomesAtHub(t, ls.hub)[third] >= 1
	})
	got := outcomesAtHub(t, ls.hub)
	if got[first] != 1 || got[third] != 1 {
		t.Errorf("the hub holds outcomes %v; want the first and third versions' once each through the restart", got)
	}
}

// The keeper refuses settings that would make it restart every source at
// every pass, or never look.
func TestSourceKeeperRefusesBadSettings(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	_, hub := sitetest.Connect(t, pair.Hub, "")
	if _, err := ops.NewSourceKeeper(hub, ops.WithStallAfter(0)); err == nil {
		t.Error("a keeper with no stall time was made; want an error naming it")
	}
	k, err := ops.NewSourceKeeper(hub)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Run(context.Background(), 0, func([]ops.SourceRestart, error) {}); err == nil {
		t.Error("a keeper ran with no interval; want an error naming it")
	}
	// A hub without Steward's streams has no sources to keep.
	if restarts, err := k.Keep(context.Background()); err != nil || len(restarts) != 0 {
		t.Errorf("on a hub without streams the keeper did %+v, %v; want nothing", restarts, err)
	}
}

// Restarting a source the hub does not have says so, and changes nothing.
func TestRestartHubSiteSourceWithoutTheSource(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	_, hub := sitetest.Connect(t, pair.Hub, "")
	sitetest.SetupBus(context.Background(), t, hub)
	err := events.RestartHubSiteSource(context.Background(), hub, events.StreamOutcomes, "site-b")
	if err == nil || !errors.Is(err, events.ErrNoSiteSource) {
		t.Fatalf("restarting a source the hub does not have: %v; want ErrNoSiteSource", err)
	}
}
