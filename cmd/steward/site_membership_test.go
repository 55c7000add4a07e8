package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/sitetest"
	"github.com/steward-dev/steward/publisher"
)

// Site membership has one writer, the controller key, and these are the
// attacks on it: a membership signed by another key, a controller
// signature for another site wrapped in this site's event, a key another
// site holds, an old membership replayed. Each is refused by `steward site
// setup` with the site's filters left as they were; the genuine ones,
// published with `steward publish --signing-key`, set exactly their keys.
func TestSiteSetupFromTheSignedMembership(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, hubJS := sitetest.Connect(t, pair.Hub, "")
	cfg := events.DefaultBusConfig(1)
	cfg.Streams.MaxBytes, cfg.Streams.DLQMaxBytes, cfg.CheckpointMaxBytes = 64<<20, 16<<20, 16<<20
	if err := events.SetupBus(ctx, hubJS, cfg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctrlKey, ctrlPub := filepath.Join(dir, "controller.key"), filepath.Join(dir, "controller.pub")
	evilKey, evilPub := filepath.Join(dir, "attacker.key"), filepath.Join(dir, "attacker.pub")
	for _, kp := range [][2]string{{ctrlKey, ctrlPub}, {evilKey, evilPub}} {
		if err := signing.GenerateKeyPair(signing.Ed25519, kp[0], kp[1]); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"STEWARD_NATS_URL=" + pair.Hub.ClientURL()}
	limits := []string{"--max-bytes", fmt.Sprint(64 << 20), "--dlq-max-bytes", fmt.Sprint(16 << 20), "--checkpoint-max-bytes", fmt.Sprint(16 << 20)}
	setup := func() result {
		return run(t, append(env, "STEWARD_CONTROLLER_KEY="+ctrlPub), append([]string{"site", "setup", "site-a"}, limits...)...)
	}
	// publish signs one membership record with key through the operator's
	// command, as the controller's desired state is published.
	publish := func(key, site string, gen int, hives, machines []string) {
		t.Helper()
		rec, err := json.Marshal(map[string]any{"type": events.TypeSiteMembership, "key": site, "data": map[string]any{
			"site": site, "generation": gen, "boxes": []string{}, "hives": hives, "machines": machines}})
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(t.TempDir(), "desired.jsonl")
		if err := os.WriteFile(f, append(rec, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		ok(t, env, "publish", "--file", f, "--signing-key", key, "--yes")
	}
	consumer := func() jetstream.ConsumerConfig {
		t.Helper()
		c, err := hubJS.PushConsumer(ctx, events.StreamEvents, events.SiteConsumer("site-a"))
		if err != nil {
			t.Fatalf("the hub's consumer for site-a: %v", err)
		}
		return c.CachedInfo().Config
	}
	wantFilters := func(what string, gen uint64, hives, machines []string) {
		t.Helper()
		c := consumer()
		want := events.Site{Name: "site-a", Hives: hives, Machines: machines}.EventSubjects()
		if !slices.Equal(c.FilterSubjects, want) {
			t.Fatalf("%s: the site's filters are %v, want exactly %v", what, c.FilterSubjects, want)
		}
		if got := events.AppliedGeneration(c); got != gen {
			t.Fatalf("%s: the hub's consumer records generation %d (metadata %v), want %d", what, got, c.Metadata, gen)
		}
	}
	refused := func(what string, wants ...string) {
		t.Helper()
		r := setup()
		if r.code == 0 {
			t.Fatalf("%s: site setup succeeded:\n%s", what, r.stdout)
		}
		for _, w := range wants {
			if !strings.Contains(r.stderr, w) {
				t.Errorf("%s: the refusal %q does not name %q", what, r.stderr, w)
			}
		}
	}

	refused("no membership yet", "no site.membership event", "filters were not changed", "steward publish")
	if _, err := hubJS.PushConsumer(ctx, events.StreamEvents, events.SiteConsumer("site-a")); err == nil {
		t.Fatal("a refused set-up made the hub's consumer for the site")
	}

	// A membership signed by any other key is not believed: with no
	// other, the set-up is refused.
	publish(evilKey, "site-a", 1, []string{"hive-evil"}, nil)
	refused("only the attacker's membership", "site-a", "is believed", "signature", "filters were not changed")
	if _, err := hubJS.PushConsumer(ctx, events.StreamEvents, events.SiteConsumer("site-a")); err == nil {
		t.Fatal("a refused set-up made the hub's consumer for the site")
	}

	// (i) The controller's membership sets exactly its keys.
	publish(ctrlKey, "site-a", 1, []string{"hive-1"}, []string{"db-1"})
	if r := setup(); r.code != 0 || !strings.Contains(r.stdout, "generation 1") {
		t.Fatalf("site setup from the signed membership: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	wantFilters("the signed membership", 1, []string{"hive-1"}, []string{"db-1"})
	stream, err := hubJS.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.GetLastMsgForSubject(ctx, events.MembershipSubject("site-a"))
	if err != nil {
		t.Fatal(err)
	}

	// (ii) A newer membership signed by another key changes nothing and
	// holds nothing up: the set-up applies the controller's again.
	applied := func(what string) {
		t.Helper()
		if r := setup(); r.code != 0 {
			t.Fatalf("%s: site setup: exit %d\n%s", what, r.code, r.stderr)
		}
	}
	publish(evilKey, "site-a", 2, []string{"hive-1", "hive-evil"}, []string{"db-1"})
	applied("after the attacker's membership")
	wantFilters("after the attacker's membership", 1, []string{"hive-1"}, []string{"db-1"})

	// (iii) A controller signature made for site-b, in site-a's event.
	signer, err := signing.LoadPrivateKey(ctrlKey)
	if err != nil {
		t.Fatal(err)
	}
	forB, err := signing.SignMembership(signer, events.Membership{V: 1, Site: "site-b", Generation: 3, Boxes: []string{}, Hives: []string{"hive-1", "hive-b"}, Machines: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	forB.Site = "site-a"
	publishData(t, ctx, hubJS, "site-a", forB)
	applied("after site-b's signature in site-a's event")
	wantFilters("after the rebound membership", 1, []string{"hive-1"}, []string{"db-1"})

	// (iv) One owner per key: site-b's newest membership holds hive-2.
	publish(ctrlKey, "site-b", 1, []string{"hive-2"}, nil)
	publish(ctrlKey, "site-a", 2, []string{"hive-1", "hive-2"}, []string{"db-1"})
	refused("hive-2 is site-b's", "hive hive-2", "site site-b", "move it by publishing site site-b's membership without it first", "filters were not changed")
	wantFilters("while site-b holds hive-2", 1, []string{"hive-1"}, []string{"db-1"})
	// A forged site-b membership without it does not release the key.
	publish(evilKey, "site-b", 5, []string{}, nil)
	refused("site-b's forged release", "hive hive-2", "site site-b")
	// The controller's does, but while site-b still receives hive-2 (set
	// up from its earlier membership and not again since) the key is not
	// free: both sites would receive its events.
	siteB := func(hives []string) {
		t.Helper()
		cfg := events.SiteConsumerConfig(events.Site{Name: "site-b", HubDomain: events.DefaultHubDomain, Hives: hives})
		if _, err := hubJS.CreateOrUpdateConsumer(ctx, events.StreamEvents, cfg); err != nil {
			t.Fatal(err)
		}
	}
	siteB([]string{"hive-2"})
	publish(ctrlKey, "site-b", 2, []string{}, nil)
	publish(ctrlKey, "site-a", 2, []string{"hive-1", "hive-2"}, []string{"db-1"})
	refused("site-b still receives hive-2", "site site-b's filters at the hub include steward.events.credential.rotated.hive-2", "steward site setup site-b", "filters were not changed")
	wantFilters("while site-b receives hive-2", 1, []string{"hive-1"}, []string{"db-1"})
	// site-b set up again from its membership: the key is moved.
	siteB(nil)
	if r := setup(); r.code != 0 {
		t.Fatalf("site setup once site-b let hive-2 go: exit %d\n%s", r.code, r.stderr)
	}
	wantFilters("after the move", 2, []string{"hive-1", "hive-2"}, []string{"db-1"})

	// (v) Generation 1 replayed after 2 is refused, once the newer one is
	// gone (STEWARD_EVENTS' retention, or a purge): the hub's consumer
	// records the generation applied. 2 again is a re-run.
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(events.MembershipSubject("site-a"))); err != nil {
		t.Fatal(err)
	}
	replay := nats.NewMsg(first.Subject)
	replay.Header, replay.Data = first.Header, first.Data
	replay.Header.Set("ce-id", "replayed-generation-1")
	replay.Header.Set(jetstream.MsgIDHeader, "replayed-generation-1")
	if _, err := hubJS.PublishMsg(ctx, replay); err != nil {
		t.Fatal(err)
	}
	refused("generation 1 replayed", "generation 1", "generation 2", "filters were not changed")
	wantFilters("after the replay", 2, []string{"hive-1", "hive-2"}, []string{"db-1"})
	publish(ctrlKey, "site-a", 2, []string{"hive-1", "hive-2"}, []string{"db-1"})
	if r := setup(); r.code != 0 {
		t.Fatalf("site setup with the applied generation again: exit %d\n%s", r.code, r.stderr)
	}
	wantFilters("the same generation again", 2, []string{"hive-1", "hive-2"}, []string{"db-1"})

	// Keys given by hand (the unsigned way) do not lower the floor.
	ok(t, env, append([]string{"site", "setup", "site-a", "--hives", "hive-1"}, limits...)...)
	wantFilters("keys by hand", 2, []string{"hive-1"}, nil)
}

// publishData publishes a site.membership event with data as it is, on
// site's subject, as anyone allowed to publish can.
func publishData(t *testing.T, ctx context.Context, js jetstream.JetStream, site string, data events.SiteMembership) {
	t.Helper()
	e, err := events.New(events.TypeSiteMembership, site, data)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := publisher.New(js, publisher.WithSource("/attacker")).Publish(ctx, e); err != nil {
		t.Fatal(err)
	}
}

// No worker reads memberships and no site is sent them: they are the
// operator's, read at the hub by site setup. A worker whose filter took
// them in (an instance named like a site, a wildcard) would see
// desired state that is not its own, and a site sourcing them would hold
// every other site's keys.
func TestNoWorkerOrSiteReadsMemberships(t *testing.T) {
	membership := events.MembershipSubject("site-a")
	for _, k := range kinds {
		for _, instance := range []string{"site-a", "membership", "*"} {
			spec := k.spec(instance)
			for _, s := range spec.Subjects {
				if server.SubjectsCollide(s, membership) || server.SubjectsCollide(s, events.MembershipSubjects()) {
					t.Errorf("worker %s, instance %q: its filter %s takes in site memberships", k.name, instance, s)
				}
			}
			if slices.Contains(spec.Types, events.TypeSiteMembership) {
				t.Errorf("worker %s accepts %s", k.name, events.TypeSiteMembership)
			}
		}
	}
	s := events.Site{Name: "site-a", HubDomain: events.DefaultHubDomain, Boxes: []string{"site-a"}, Hives: []string{"site-a"}, Machines: []string{"site-a"}}
	for _, f := range s.EventSubjects() {
		if server.SubjectsCollide(f, events.MembershipSubjects()) {
			t.Errorf("site filter %s sources memberships to the site", f)
		}
	}
}
