package events_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/sitetest"
	"github.com/steward-dev/steward/workers/workertest"
)

func testSite() events.Site {
	return events.Site{Name: "site-a", HubDomain: "hub", Boxes: []string{"box-1"}, Hives: []string{"hive-2", "hive-1"}, Machines: []string{"m-1"}}
}

// A site receives exactly its keys' subjects and the ones every site needs.
func TestSiteEventSubjectsAreItsKeysAndTheSharedOnes(t *testing.T) {
	got := testSite().EventSubjects()
	want := []string{
		"steward.events.credential.rotated.hive-1",
		"steward.events.credential.rotated.hive-2",
		"steward.events.grant.changed.m-1",
		"steward.events.hostfloor.published",
		"steward.events.invitation.written.box-1",
		"steward.events.release.published",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("subjects %v, want %v", got, want)
	}
}

// The site's events stream listens on nothing itself (a publish at the hub
// is stored and acknowledged there alone), sources the hub's stream in the
// hub's domain through the hub's durable consumer for the site, filtered
// to the site's subjects, and keeps the stored notices stream readers wake
// on.
func TestSiteStreamConfigsSourceTheHubAndListenOnNothing(t *testing.T) {
	s := testSite()
	configs := events.SiteStreamConfigs(events.DefaultStreamConfig(), s)
	if len(configs) != 3 {
		t.Fatalf("%d streams, want 3", len(configs))
	}
	for _, sc := range configs {
		if sc.Discard != jetstream.DiscardNew || sc.MaxBytes < 1 || sc.MaxConsumers < 1 {
			t.Errorf("stream %s: discard %v, max bytes %d, max consumers %d: want the hub's explicit limits", sc.Name, sc.Discard, sc.MaxBytes, sc.MaxConsumers)
		}
		if sc.Name != events.StreamEvents {
			if len(sc.Sources) != 0 || len(sc.Subjects) != 1 {
				t.Errorf("stream %s: subjects %v, sources %d: want its own subjects, written at the site", sc.Name, sc.Subjects, len(sc.Sources))
			}
			continue
		}
		if len(sc.Subjects) != 0 {
			t.Errorf("the site's events stream listens on %v: the hub and the site would both store and ack a publish", sc.Subjects)
		}
		if sc.RePublish == nil || sc.RePublish.Destination != events.StoredPrefix+".>" || !sc.RePublish.HeadersOnly {
			t.Errorf("republish %+v: want headers-only stored notices on %s.>", sc.RePublish, events.StoredPrefix)
		}
		if !sc.AllowDirect {
			t.Error("the site's events stream does not answer direct gets, which stream readers read with")
		}
		if sc.PersistMode != jetstream.DefaultPersistMode {
			t.Errorf("persist mode %v: want every write synced, since a leaf started again resumes from the hub's ack floor, past an async tail it lost", sc.PersistMode)
		}
		if len(sc.Sources) != 1 {
			t.Fatalf("%d sources, want the hub's one", len(sc.Sources))
		}
		src := sc.Sources[0]
		if src.Name != events.StreamEvents || src.Domain != "hub" || src.FilterSubject != "" || len(src.SubjectTransforms) != 0 {
			t.Errorf("source %s in domain %q, filter %q, %d transforms: want STEWARD_EVENTS in hub, filtered by the hub's consumer", src.Name, src.Domain, src.FilterSubject, len(src.SubjectTransforms))
		}
		if src.Consumer == nil || src.Consumer.Name != events.SiteConsumer(s.Name) || src.Consumer.DeliverSubject != events.SiteConsumerConfig(s).DeliverSubject {
			t.Errorf("source consumer %+v: want the hub's durable consumer for the site", src.Consumer)
		}
	}
	cc := events.SiteConsumerConfig(s)
	if !slices.Equal(cc.FilterSubjects, s.EventSubjects()) {
		t.Errorf("the hub's consumer filters %v, want %v", cc.FilterSubjects, s.EventSubjects())
	}
	if cc.AckPolicy != jetstream.AckFlowControlPolicy || !cc.FlowControl || cc.IdleHeartbeat != time.Second || cc.MaxAckPending < 1 || cc.AckWait != 0 {
		t.Errorf("the hub's consumer: ack %v, flow control %v, heartbeat %v, max ack pending %d, ack wait %v: want what durable sourcing requires",
			cc.AckPolicy, cc.FlowControl, cc.IdleHeartbeat, cc.MaxAckPending, cc.AckWait)
	}
	if strings.HasPrefix(cc.DeliverSubject, "steward.") {
		t.Errorf("the hub's consumer delivers on %s, which the link does not carry", cc.DeliverSubject)
	}
}

func TestSiteCheckRefusesWhatNoDomainOrKeyCanBe(t *testing.T) {
	for name, s := range map[string]events.Site{
		"a dot in the name":   {Name: "site.a", HubDomain: "hub"},
		"no hub domain":       {Name: "site-a"},
		"the hub's name":      {Name: "hub", HubDomain: "hub"},
		"a wildcard box":      {Name: "site-a", HubDomain: "hub", Boxes: []string{"*"}},
		"a hive listed twice": {Name: "site-a", HubDomain: "hub", Hives: []string{"h", "h"}},
	} {
		if err := s.Check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := testSite().Check(); err != nil {
		t.Fatal(err)
	}
}

func TestSiteOfReadsBackTheSourceHubSiteSourceMade(t *testing.T) {
	src := events.HubSiteSource(events.StreamOutcomes, "site-a")
	if got, ok := events.SiteOf(src, events.StreamOutcomes); !ok || got != "site-a" {
		t.Fatalf("SiteOf = %q, %v", got, ok)
	}
	if _, ok := events.SiteOf(src, events.StreamDLQ); ok {
		t.Error("a source of another stream is taken for the site's")
	}
	if _, ok := events.SiteOf(&jetstream.StreamSource{Name: events.StreamOutcomes}, events.StreamOutcomes); ok {
		t.Error("a local source is taken for a site's")
	}
}

// On a real hub and leaf: the site receives its own keys' events and no
// other, once, with a stored notice at the site and none from the hub; an
// outcome written at the site reaches the hub's stream; the hub's set-up
// run again keeps the site's sources.
func TestSetupSiteSourcesTheHubAndBack(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	hub, leaf := pair.Hub, pair.Leaf
	_, hubJS := sitetest.Connect(t, hub, "hub")
	siteNC, siteJS := sitetest.Connect(t, leaf, "site-a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// At its own leaf node a site's JetStream is the server's own API, so
	// a worker's credentials (scoped to $JS.API) work there unchanged; from
	// the hub it is the domain's.
	if p := siteJS.Options().Domain; p != "" {
		t.Errorf("at the leaf node, the site's JetStream is addressed through domain %q, want the server's own API", p)
	}
	hubNC, _ := sitetest.Connect(t, hub, "hub")
	siteFromHub, err := events.JetStreamIn(hubNC, "site-a")
	if err != nil {
		t.Fatal(err)
	}
	if siteFromHub.Options().Domain != "site-a" {
		t.Errorf("from the hub, the site's JetStream is addressed through domain %q, want site-a", siteFromHub.Options().Domain)
	}
	cfg := sitetest.SetupBus(ctx, t, hubJS)
	// A source as the site's first set-up made it, creating a consumer of
	// its own at the site: set up again, it is replaced by the durable one.
	outcomes, err := hubJS.Stream(ctx, events.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	old := outcomes.CachedInfo().Config
	old.Sources = []*jetstream.StreamSource{{Name: events.StreamOutcomes, External: &jetstream.ExternalStream{APIPrefix: "$JS.site-a.API"}}}
	if _, err := hubJS.UpdateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := events.SetupSite(ctx, siteJS, hubJS, cfg, testSite()); err != nil {
		t.Fatal(err)
	}
	// Twice changes nothing: the hub keeps one source per site.
	if err := events.SetupSite(ctx, siteJS, hubJS, cfg, testSite()); err != nil {
		t.Fatal(err)
	}
	if st, err := siteJS.Stream(ctx, events.StreamEvents); err != nil {
		t.Fatal(err)
	} else if m := st.CachedInfo().Config.PersistMode; m != jetstream.DefaultPersistMode {
		t.Errorf("a new site's events stream has persist mode %v, want every write synced", m)
	} else if err := events.CheckSiteEventsSynced("site-a", st.CachedInfo().Config); err != nil {
		t.Errorf("a new site's events stream: %v, want it found synced", err)
	}
	notices, err := siteNC.SubscribeSync(events.StoredPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := siteNC.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, hive := range []string{"hive-1", "hive-9"} {
		ack, err := hubJS.Publish(ctx, "steward.events.credential.rotated."+hive, []byte("{}"), jetstream.WithMsgID("e-"+hive))
		if err != nil {
			t.Fatal(err)
		}
		if ack.Domain != "hub" {
			t.Errorf("publish acknowledged by domain %q, want the hub's alone", ack.Domain)
		}
	}
	workertest.WaitUntil(t, "the site holds its hive's event", func() bool {
		st, err := siteJS.Stream(ctx, events.StreamEvents)
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 1
	})
	st, err := siteJS.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, "steward.events.credential.rotated.hive-9"); err == nil {
		t.Error("the site holds another site's hive's event")
	}
	// A hub-side tool reads the same site stream through the domain.
	fromHub, err := siteFromHub.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fromHub.GetLastMsgForSubject(ctx, "steward.events.credential.rotated.hive-1"); err != nil {
		t.Errorf("the hub does not read the site's stream through its domain: %v", err)
	}
	m, err := notices.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no stored notice at the site: %v", err)
	}
	if m.Subject != events.StoredSubject("steward.events.credential.rotated.hive-1") {
		t.Errorf("stored notice on %s, want the site's hive-1", m.Subject)
	}
	// Nothing of Steward's crosses the link: the leaf asks the hub for
	// no interest in its subjects, so no hub notice, event or outcome
	// reaches it but through JetStream.
	lz, err := hub.Leafz(&server.LeafzOptions{Subscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lz.Leafs {
		for _, sub := range l.Subs {
			if strings.HasPrefix(sub, "steward.") {
				t.Errorf("the leaf link carries interest in %s", sub)
			}
		}
	}

	// An outcome written at the site is stored there and sourced by the hub.
	ack, err := siteJS.Publish(ctx, events.OutcomeSubject("credential", "hive-1"), []byte("{}"), jetstream.WithMsgID("o-1"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Domain != "site-a" || ack.Stream != events.StreamOutcomes {
		t.Errorf("outcome acknowledged by %s in %q, want the site's", ack.Stream, ack.Domain)
	}
	workertest.WaitUntil(t, "the hub holds the site's outcome", func() bool {
		s, err := hubJS.Stream(ctx, events.StreamOutcomes)
		if err != nil {
			return false
		}
		_, err = s.GetLastMsgForSubject(ctx, events.OutcomeSubject("credential", "hive-1"))
		return err == nil
	})

	if err := events.SetupBus(ctx, hubJS, cfg); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{events.StreamOutcomes, events.StreamDLQ} {
		s, err := hubJS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var sites []string
		for _, src := range s.CachedInfo().Config.Sources {
			if site, ok := events.SiteOf(src, name); ok {
				sites = append(sites, site)
			}
			if src.Consumer == nil || src.Consumer.Name != events.HubSourceConsumer || src.Consumer.DeliverSubject != events.SiteSourcedSubject("site-a", name) {
				t.Errorf("the hub's %s sources site A through %+v, want the site's durable consumer for the hub", name, src.Consumer)
			}
		}
		if !slices.Equal(sites, []string{"site-a"}) {
			t.Errorf("the hub's %s sources sites %v after setup ran again, want [site-a] once", name, sites)
		}
	}
}

// A site whose events stream an earlier set-up made with persist_mode:
// async is set up again without error (nats-server refuses to change a
// stream's persist mode), keeps it, and is found async by the check the
// operator's warnings come from (a new site's is found synced in
// TestSetupSiteSourcesTheHubAndBack).
func TestSetupSiteKeepsAnEarlierPersistMode(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	_, hubJS := sitetest.Connect(t, pair.Hub, "hub")
	_, siteJS := sitetest.Connect(t, pair.Leaf, "site-a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := sitetest.SetupBus(ctx, t, hubJS)
	s := testSite()
	sitetest.MakeAsyncSiteEvents(ctx, t, hubJS, siteJS, cfg, s)
	if err := events.SetupSite(ctx, siteJS, hubJS, cfg, s); err != nil {
		t.Fatalf("set up again over an async events stream: %v", err)
	}
	configs := map[string]jetstream.StreamConfig{}
	for _, name := range []string{events.StreamEvents, events.StreamOutcomes} {
		st, err := siteJS.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		configs[name] = st.CachedInfo().Config
	}
	if ev, out := configs[events.StreamEvents].PersistMode, configs[events.StreamOutcomes].PersistMode; ev != jetstream.AsyncPersistMode || out != jetstream.DefaultPersistMode {
		t.Errorf("persist modes: events %v, outcomes %v; want the events stream's kept async, the outcomes' default", ev, out)
	}
	err := events.CheckSiteEventsSynced("site-a", configs[events.StreamEvents])
	if !errors.Is(err, events.ErrSiteEventsAsync) || !strings.Contains(err.Error(), "site site-a") || !strings.Contains(err.Error(), "SIGTERM") {
		t.Errorf("the kept async events stream checked: %v, want ErrSiteEventsAsync naming the site and the way to stop its leaf node", err)
	}
}
