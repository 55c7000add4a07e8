package e2e

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/fleet"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/streamread"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// siteCut is how long site A's link to the hub is cut in the test: the
// issue's scenario, a minute.
const siteCut = 60 * time.Second

// machinesPerSite is how many database machines (grant.changed, one
// provision-like instance each) each site has beside its hives.
const machinesPerSite = 5

// leafNode is a nats-server process whose configuration `steward site
// config` wrote.
type leafNode struct {
	name     string
	port     int
	httpPort int
	p        *proc
}

func (n *leafNode) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// leafs is how many leaf connections the server at httpPort has.
func leafs(httpPort int) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/leafz", httpPort), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	var lz struct {
		Leafs int `json:"leafnodes"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&lz); err != nil {
		return -1, err.Error()
	}
	return lz.Leafs, fmt.Sprintf("%d leaf connections", lz.Leafs)
}

// siteLedger is the world of a site's instances: per hive, the versions
// applied in order; per machine, the generations.
type siteLedger struct {
	mu      sync.Mutex
	applied map[string][]uint64
}

func (l *siteLedger) apply(hive string, v uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied[hive] = append(l.applied[hive], v)
}

func (l *siteLedger) last(hive string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.applied[hive]
	if len(a) == 0 {
		return 0
	}
	return a[len(a)-1]
}

// TestSitesConvergeThroughACut is issue 27's scenario at a smaller scale.
// Invariant: a hub and two sites, each a leaf node with its own JetStream
// domain set up by `steward site config` and `steward site setup`, with
// stream-reading credential instances on the runtime at each site, pointed
// at their leaf node in their site's domain, and provision-like instances
// for each site's machines. Site A's link is cut (a TCP proxy closed) for
// a minute while three rounds of signed rotations and grants for both
// sites' hives and machines are published at the hub, and site A's leaf
// node is SIGKILLed and restarted during the cut. Site B converges during the cut, site A only after the link is back;
// over both sites: 0 lost, 0 applied twice, 0 backwards, and every event's
// outcome (applied or superseded) at the hub. The bus is open.
func TestSitesConvergeThroughACut(t *testing.T) { sitesThroughACut(t, nil) }

// TestSitesConvergeThroughACutOnTheClosedBus is the same cut on the closed
// bus, set up with the commands an operator runs: the hub in JWT mode,
// each site's leaf node linked with its own leaf identity (steward creds
// issue leaf), its streams made at the site (site setup --site-url), each
// instance with credentials and document keys of its own. The link
// carries only what the leaf identity allows, through the cut, the leaf
// node's SIGKILL and the catch-up.
func TestSitesConvergeThroughACutOnTheClosedBus(t *testing.T) {
	sitesThroughACut(t, newClosedSites(t))
}

// sitesThroughACut runs the cut on the open bus (closed nil) or on the
// closed one.
func sitesThroughACut(t *testing.T, closed *closedSites) {
	// rounds: round 1 before the cut, 2..rounds during it.
	const rounds = 4
	// The 200 hives a site (and 5 machines); the cut's minute is
	// most of the test's time whatever the number.
	// STEWARD_E2E_SITE_INSTANCES measures further.
	perSite := 200
	if v := os.Getenv("STEWARD_E2E_SITE_INSTANCES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("STEWARD_E2E_SITE_INSTANCES=%q: want a positive number", v)
		}
		perSite = n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The hub: JetStream in domain hub, a leaf node port.
	leafPort := workertest.FreePort(t)
	hub := newNATSNode(t, "hub", 0)
	hubConf := filepath.Join(t.TempDir(), "hub.conf")
	if err := os.WriteFile(hubConf, []byte(fmt.Sprintf("server_name: hub\njetstream {\n  domain: hub\n  sync_interval: always\n}\nleafnodes {\n  listen: \"127.0.0.1:%d\"\n}\n", leafPort)+closed.hubConf()), 0o644); err != nil {
		t.Fatal(err)
	}
	hub.p = newProc(t, "nats-hub", bins.nats, []string{"-c", hubConf, "-sd", hub.store, "-a", "127.0.0.1",
		"-p", fmt.Sprint(hub.port), "-m", fmt.Sprint(hub.httpPort)}, nil)
	hub.start(t)
	// The link's cut: a TCP proxy between site A's leaf node and the
	// hub's leaf port, the bench's own (fleet.LinkProxy).
	proxy, err := fleet.StartLinkProxy(fmt.Sprintf("127.0.0.1:%d", leafPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Cut)

	startLeaf := func(name, hubURL string) *leafNode {
		n := &leafNode{name: name, port: workertest.FreePort(t), httpPort: workertest.FreePort(t)}
		conf := filepath.Join(t.TempDir(), name+".conf")
		args := append([]string{"site", "config", name, "--hub-url", hubURL, "--store-dir", t.TempDir(),
			"--listen", fmt.Sprintf("127.0.0.1:%d", n.port), "--http-listen", fmt.Sprintf("127.0.0.1:%d", n.httpPort),
			"--max-file-store", "1GB", "--out", conf}, closed.leafArgs(t, name)...)
		out := runSteward(t, nil, args...)
		t.Logf("%s", out)
		n.p = newProc(t, "nats-"+name, bins.nats, []string{"-c", conf}, nil)
		n.p.start()
		waitFor(t, "leaf "+name+" is healthy", time.Minute, func() (bool, string) {
			return httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", n.httpPort))
		})
		return n
	}
	siteA := startLeaf("site-a", "nats-leaf://"+proxy.Addr())
	siteB := startLeaf("site-b", fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort))
	linked := func(n int) func() (bool, string) {
		return func() (bool, string) {
			got, last := leafs(hub.httpPort)
			return got == n, last
		}
	}
	waitFor(t, "both sites are linked", time.Minute, linked(2))

	b := closed.connect(t, hub.url())
	leafOf := map[string]*leafNode{"site-a": siteA, "site-b": siteB}
	cfg := events.DefaultBusConfig(1)
	cfg.Streams.MaxBytes, cfg.Streams.DLQMaxBytes, cfg.CheckpointMaxBytes = 256<<20, 64<<20, 64<<20
	if err := events.SetupBus(ctx, b.js, cfg); err != nil {
		t.Fatal(err)
	}
	// Each site's keys are its membership, signed by the controller and
	// published at the hub as the operator does; site setup reads and
	// verifies it (the one writer of which key is at which site).
	memberKey, memberPub := filepath.Join(t.TempDir(), "controller.key"), filepath.Join(t.TempDir(), "controller.pub")
	if err := signing.GenerateKeyPair(signing.Ed25519, memberKey, memberPub); err != nil {
		t.Fatal(err)
	}
	hives, machines := map[string][]string{}, map[string][]string{}
	for _, site := range []string{"site-a", "site-b"} {
		for i := range perSite {
			hives[site] = append(hives[site], fmt.Sprintf("%s-hive-%d", site, i+1))
		}
		for i := range machinesPerSite {
			machines[site] = append(machines[site], fmt.Sprintf("%s-db-%d", site, i+1))
		}
		rec, err := json.Marshal(map[string]any{"type": events.TypeSiteMembership, "key": site, "data": map[string]any{
			"site": site, "generation": 1, "boxes": []string{}, "hives": hives[site], "machines": machines[site]}})
		if err != nil {
			t.Fatal(err)
		}
		desired := filepath.Join(t.TempDir(), site+".jsonl")
		if err := os.WriteFile(desired, append(rec, '\n'), 0o600); err != nil {
			t.Fatal(err)
		}
		runSteward(t, closed.operatorEnv(), "publish", "--nats-url", hub.url(), "--file", desired, "--signing-key", memberKey, "--yes")
		out := runSteward(t, closed.operatorEnv(), "site", "setup", site, "--nats-url", hub.url(), "--site-url", leafOf[site].url(),
			"--controller-key", memberPub,
			"--max-bytes", fmt.Sprint(256<<20), "--dlq-max-bytes", fmt.Sprint(64<<20), "--checkpoint-max-bytes", fmt.Sprint(64<<20))
		if want := fmt.Sprintf("%d hives, %d machines", len(hives[site]), len(machines[site])); !strings.Contains(out, want) {
			t.Fatalf("site setup %s from its signed membership said %q; want its %s", site, out, want)
		}
		// The hub and, on the closed bus (--site-url), the leaf node run
		// a nats-server that resets a durable source without skipping.
		if strings.Contains(out, "warning:") {
			t.Errorf("site setup %s warned:\n%s", site, out)
		}
	}

	// The operator's keeper of the hub's sources of each site's outcomes
	// and dead letters, run beside the hub as a site deployment runs it:
	// nats-server alone can leave a source stalled for minutes after a
	// relink (docs/design.md §9).
	keeper := newProc(t, "site-keep", bins.steward, []string{"site", "keep", "--nats-url", hub.url(),
		"--stall-after", "5s", "--interval", "1s", "--log-format", "json"}, envList(closed.operatorEnv()))
	keeper.start()

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := signing.NewKeySet(pub)
	if err != nil {
		t.Fatal(err)
	}
	// version is a rotation's signed version or a grant's signed
	// generation: what the instances rank and apply by.
	version := func(d *workers.Delivery) (uint64, error) {
		if d.Event.Type() == events.TypeGrantChanged {
			var data events.GrantChanged
			if err := d.DataAs(&data); err != nil {
				return 0, err
			}
			g, err := signing.OpenGrant(keys, data)
			if err != nil {
				return 0, err
			}
			return g.Generation, nil
		}
		var data events.CredentialRotated
		if err := d.DataAs(&data); err != nil {
			return 0, err
		}
		r, err := signing.OpenRotation(keys, data)
		if err != nil {
			return 0, err
		}
		return r.Version, nil
	}

	// The instances: each site's, on connections to its own leaf node, in
	// its domain, reading the stream.
	ledger := map[string]*siteLedger{"site-a": {applied: map[string][]uint64{}}, "site-b": {applied: map[string][]uint64{}}}
	runCtx, stopAll := context.WithCancel(context.Background())
	var running sync.WaitGroup
	t.Cleanup(func() { stopAll(); running.Wait() })
	var started atomic.Int64
	for site, leaf := range leafOf {
		var conns []jetstream.JetStream
		for range 2 {
			if closed != nil {
				break // each instance connects as itself, below
			}
			nc, err := nats.Connect(leaf.url(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			// As `steward worker --js-domain` does: the leaf node's own API.
			js, err := events.JetStreamIn(nc, site)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, js)
		}
		l := ledger[site]
		// Each key is an instance: a credential one per hive, a
		// provision one per machine (its handler stands in for the
		// database, as the hives' does for the files).
		type instanceOf struct{ worker, key, typ, subject string }
		var all []instanceOf
		for _, hive := range hives[site] {
			all = append(all, instanceOf{credentialWorker, hive, events.TypeCredentialRotated, events.EventsPrefix + ".credential.rotated." + hive})
		}
		for _, machine := range machines[site] {
			all = append(all, instanceOf{"provision", machine, events.TypeGrantChanged, events.EventsPrefix + ".grant.changed." + machine})
		}
		for i, in := range all {
			hive := in.key
			spec := workers.Spec{
				Name: in.worker, Instance: in.key,
				Subjects: []string{in.subject},
				Types:    []string{in.typ},
				Rank:     func(_ context.Context, d *workers.Delivery) (uint64, error) { return version(d) },
			}
			js, opts := closed.instance(t, leaf.url(), site, in.worker, in.key)
			if js == nil {
				js = conns[i%len(conns)]
			}
			w, err := workers.New(js, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
				v, err := version(d)
				if err != nil {
					return workers.Refused(err)
				}
				if v <= l.last(d.Key) {
					return nil // in place already, as the credential worker's ..data says
				}
				l.apply(d.Key, v)
				return d.Emit(ctx, "applied", map[string]any{"hive": d.Key, "version": v})
			}), append(opts, workers.WithReadMode(workers.ReadStream), workers.WithDomain(site))...)
			if err != nil {
				t.Fatal(err)
			}
			running.Add(1)
			go func() { defer running.Done(); _ = w.Run(runCtx) }()
			go func() {
				waitFor(t, "instance "+hive+" is reading", time.Minute, func() (bool, string) { return w.Ready() == nil, fmt.Sprint(w.Ready()) })
				started.Add(1)
			}()
		}
	}
	waitFor(t, "every instance is reading", 2*time.Minute, func() (bool, string) {
		return started.Load() == int64(2*(perSite+machinesPerSite)), fmt.Sprintf("%d of %d", started.Load(), 2*(perSite+machinesPerSite))
	})

	// publishRound publishes version v of every hive of both sites at the
	// hub, signed, each retried until the hub acknowledges it.
	ids := map[string]string{} // event id -> site
	publishRound := func(v uint64) {
		for site, list := range hives {
			for _, hive := range list {
				data, err := signing.SignRotation(priv, events.CredentialRotated{Hive: hive, Version: v, ClientID: clientID(hive, v), Secret: rotationSecret})
				if err != nil {
					t.Fatal(err)
				}
				e, err := events.New(events.TypeCredentialRotated, hive, data)
				if err != nil {
					t.Fatal(err)
				}
				e.SetID(fmt.Sprintf("sites-%s-%d", hive, v))
				if _, _, err := b.publishAcked(ctx, e); err != nil {
					t.Fatal(err)
				}
				ids[e.ID()] = site
			}
			for _, machine := range machines[site] {
				data, err := signing.SignGrant(priv, events.GrantChanged{
					Machine: machine, Requirement: "postgres", Generation: v,
					Given: []events.Given{{From: "app", Node: "app-1", Values: events.GivenValues{Name: "app"}, Secret: rotationSecret}},
				})
				if err != nil {
					t.Fatal(err)
				}
				e, err := events.New(events.TypeGrantChanged, machine, data)
				if err != nil {
					t.Fatal(err)
				}
				e.SetID(fmt.Sprintf("sites-%s-%d", machine, v))
				if _, _, err := b.publishAcked(ctx, e); err != nil {
					t.Fatal(err)
				}
				ids[e.ID()] = site
			}
		}
	}
	// keysOf is every key of a site, hives and machines.
	keysOf := func(site string) []string { return append(slices.Clone(hives[site]), machines[site]...) }
	atVersion := func(site string, v uint64) func() (bool, string) {
		return func() (bool, string) {
			n, keys := 0, keysOf(site)
			for _, key := range keys {
				if ledger[site].last(key) >= v {
					n++
				}
			}
			return n == len(keys), fmt.Sprintf("%s: %d of %d hives and machines at version %d", site, n, len(keys), v)
		}
	}

	publishRound(1)
	first := waitFor(t, "both sites apply round 1", 2*time.Minute, func() (bool, string) {
		okA, lastA := atVersion("site-a", 1)()
		okB, lastB := atVersion("site-b", 1)()
		return okA && okB, lastA + "; " + lastB
	})

	// The cut: site A's link closed and refused, its leaf node killed and
	// restarted behind it, while rounds 2.. are published at the hub.
	proxy.Cut()
	cutAt := time.Now()
	waitFor(t, "the hub sees site A gone", time.Minute, linked(1))
	for v := uint64(2); v <= rounds; v++ {
		publishRound(v)
	}
	bDuringCut := waitFor(t, "site B converges during the cut", 2*time.Minute, atVersion("site-b", rounds))
	siteA.p.kill()
	siteA.p.start()
	waitFor(t, "site A's leaf node is healthy again", time.Minute, func() (bool, string) {
		return httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", siteA.httpPort))
	})
	// The hub says which site is behind, and by how much.
	behind := uint64((rounds - 1) * (perSite + machinesPerSite))
	during := siteStatusAs(t, hub.url(), closed.operatorEnv())
	if a, bb := during["site-a"], during["site-b"]; a.Linked || a.Pending != behind || !bb.Linked || bb.Pending != 0 {
		t.Errorf("during the cut the hub reports site A linked %v, %d behind, site B linked %v, %d behind; want A unlinked and %d behind, B linked and 0",
			a.Linked, a.Pending, bb.Linked, bb.Pending, behind)
	}
	// And since when: the oldest event it holds for site A was published
	// during the cut.
	if a := during["site-a"]; a.OldestPending == nil || a.OldestPending.Before(cutAt) || a.OldestPendingSeconds <= 0 {
		t.Errorf("during the cut the hub reports site A's oldest pending event stored at %v (%.1fs ago); want one published since the cut at %v",
			a.OldestPending, a.OldestPendingSeconds, cutAt.UTC())
	}
	// The cut lasts siteCut, and through all of it site A must not move:
	// watched, not slept through.
	waitFor(t, "the cut has lasted its length with site A held back", siteCut+time.Minute, func() (bool, string) {
		for _, hive := range hives["site-a"] {
			if v := ledger["site-a"].last(hive); v != 1 {
				t.Fatalf("%s reached version %d during the cut: the cut let events through", hive, v)
			}
		}
		return time.Since(cutAt) >= siteCut, "cut for " + time.Since(cutAt).Round(time.Second).String()
	})
	if err := proxy.Heal(); err != nil {
		t.Fatal(err)
	}
	healedAt := time.Now()
	cut := healedAt.Sub(cutAt)
	relinked := waitFor(t, "site A is linked again", time.Minute, linked(2))
	waitFor(t, "site A converges after the heal", 2*time.Minute, atVersion("site-a", rounds))
	aAfterHeal := time.Since(healedAt)
	waitFor(t, "the hub reports every site caught up", time.Minute, func() (bool, string) {
		st := siteStatusAs(t, hub.url(), closed.operatorEnv())
		return st["site-a"].Linked && st["site-a"].Pending == 0 && st["site-a"].OldestPending == nil && st["site-b"].Pending == 0, fmt.Sprintf("%+v", st)
	})

	// Every event has exactly one outcome at the hub, applied or superseded.
	// Where a missing one is, is read at its site's own leaf node, as a
	// reader at the site reads it: through the hub, on the closed bus, a
	// site answers only a connection with its site's inbox prefix, and a
	// read with the test's hung until its 30 s timeout.
	atSite := map[string]*bus{}
	for site, leaf := range leafOf {
		atSite[site] = closed.connect(t, leaf.url())
	}
	outcomes := map[string][]string{}
	var lastLook time.Time
	atSites := ""
	// The hub sources each site's outcomes. A source that failed through
	// the cut is retried by nats-server with a backoff of up to two
	// minutes (its retryMaximum), unless the relink finds it idle; the
	// keeper restarts one still silent 5 s after the relink, so this waits
	// on the keeper, well short of that backoff.
	waitFor(t, "every event's outcome is at the hub", time.Minute, func() (bool, string) {
		clear(outcomes)
		err := b.each(events.StreamOutcomes, nil, func(m jetstream.Msg) error {
			e, err := events.Decode(m.Headers(), m.Data())
			if err != nil {
				return err
			}
			cause, _ := e.Extensions()["causationid"].(string)
			outcomes[cause] = append(outcomes[cause], e.Type())
			return nil
		})
		if err != nil {
			return false, err.Error()
		}
		missing := map[string]bool{}
		for id := range ids {
			if len(outcomes[id]) == 0 {
				missing[id] = true
			}
		}
		if len(missing) == 0 {
			return true, ""
		}
		// Where the missing ones are is read every few seconds, not at
		// every look: it reads every site's outcomes.
		if time.Since(lastLook) > 5*time.Second {
			lastLook, atSites = time.Now(), atTheirSites(atSite, ids, missing)+hubSourcesOf(b, atSite)+
				fmt.Sprintf("; the keeper has restarted %d sources", strings.Count(keeper.tail(1_000_000), keeperRestarted))
		}
		return false, fmt.Sprintf("%d of %d events without an outcome at the hub%s", len(missing), len(ids), atSites)
	})
	outcomesAfterHeal := time.Since(healedAt)
	twice, superseded := 0, 0
	for id := range ids {
		if len(outcomes[id]) != 1 {
			twice++
			t.Errorf("event %s has outcomes %v at the hub, want one", id, outcomes[id])
		}
		if o := outcomes[id][0]; o == events.OutcomeType(credentialWorker, events.OutcomeSuperseded) || o == events.OutcomeType("provision", events.OutcomeSuperseded) {
			superseded++
		}
	}

	lost, dup, backwards := 0, 0, 0
	for site := range hives {
		for _, hive := range keysOf(site) {
			a := ledger[site].applied[hive]
			seen := map[uint64]bool{}
			for j, v := range a {
				if seen[v] {
					dup++
				}
				seen[v] = true
				if j > 0 && v < a[j-1] {
					backwards++
				}
			}
			if !seen[1] || !seen[rounds] {
				lost++
			}
		}
	}
	// Nothing the sites needed was refused at a link (a refusal closes it).
	violations := 0
	for _, p := range []*proc{hub.p, siteA.p, siteB.p} {
		for _, line := range strings.Split(p.tail(1_000_000), "\n") {
			if strings.Contains(line, "Violation") {
				violations++
				t.Errorf("%s", line)
			}
		}
	}
	// What the keeper did: each restart is logged, and none may fail (a
	// source left out of the hub's stream); a pass that could not read the
	// hub is tried again at the next, so it is counted, not failed.
	keeperLog := keeper.tail(1_000_000)
	restarts, unread := strings.Count(keeperLog, keeperRestarted), strings.Count(keeperLog, "were not read")
	for _, line := range strings.Split(keeperLog, "\n") {
		if strings.Contains(line, "was not restarted") {
			t.Errorf("steward site keep: %s", line)
		}
	}
	if lost+dup+backwards+twice != 0 {
		t.Errorf("lost %d, applied twice %d, backwards %d, outcomes not one %d; want 0 each", lost, dup, backwards, twice)
	}
	summary(t, closed.summaryName(),
		"sites", 2, "instances_per_site", perSite+machinesPerSite, "hives_per_site", perSite, "machines_per_site", machinesPerSite, "read_mode", "stream", "auth", closed.name(),
		"round1_both_sites", round(first), "cut", round(cut), "leaf_killed_during_cut", true,
		"site_b_converged_during_cut", round(bDuringCut), "hub_reported_site_a_behind", during["site-a"].Pending, "hub_reported_site_a_oldest_pending_age", round(time.Duration(during["site-a"].OldestPendingSeconds*float64(time.Second))), "site_a_relinked_after_heal", round(relinked), "site_a_converged_after_heal", round(aAfterHeal), "outcomes_at_hub_after_heal", round(outcomesAfterHeal),
		"sources_restarted_by_keeper", restarts, "keeper_passes_unread", unread, "events", len(ids), "superseded", superseded, "lost", lost, "duplicates_applied", dup, "backwards", backwards, "link_violations", violations)
}

// keeperRestarted ends the line `steward site keep` logs for each source
// it restarted (cmd/steward/site.go).
const keeperRestarted = "so it was restarted"

// siteStatusAs is `steward site status --json` at the hub, by site, run
// with env (the operator's credentials on the closed bus).
func siteStatusAs(t testing.TB, hubURL string, env map[string]string) map[string]ops.Site {
	t.Helper()
	var list []ops.Site
	if err := json.Unmarshal([]byte(runSteward(t, env, "site", "status", "--json", "--nats-url", hubURL)), &list); err != nil {
		t.Fatalf("steward site status --json: %v", err)
	}
	out := map[string]ops.Site{}
	for _, s := range list {
		out[s.Name] = s
	}
	return out
}

// atTheirSites says how many of the events missing at the hub have an
// outcome in their own site's domain, read at each site's leaf node
// (atSite): all of them means the hub's sourcing of outcomes is behind,
// fewer means outcomes were never written.
func atTheirSites(atSite map[string]*bus, ids map[string]string, missing map[string]bool) string {
	held := map[string]bool{}
	for site := range sitesOf(ids) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := streamread.Each(ctx, atSite[site].js, streamread.Range{Stream: events.StreamOutcomes}, func(m jetstream.Msg) error {
			if e, err := events.Decode(m.Headers(), m.Data()); err == nil {
				if cause, _ := e.Extensions()["causationid"].(string); missing[cause] && ids[cause] == site {
					held[cause] = true
				}
			}
			return nil
		})
		cancel()
		if err != nil {
			return fmt.Sprintf(" (%s's outcomes not read: %v)", site, err)
		}
	}
	return fmt.Sprintf("; %d of them have one at their site", len(held))
}

// hubSourcesOf says, for each site, how far the hub's source of its
// outcomes has read and how far the site's own stream goes, with what the
// hub reports of the source's contact and what the site's consumer for it
// reports: a source behind its site yet in contact is one the keeper,
// which restarts only silent sources, leaves alone (this test once timed
// out with 200 outcomes held at site A and no restart), while one silent
// is the keeper's to restart.
func hubSourcesOf(hub *bus, atSite map[string]*bus) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := hub.js.Stream(ctx, events.StreamOutcomes)
	if err != nil {
		return fmt.Sprintf("; the hub's %s not read: %v", events.StreamOutcomes, err)
	}
	var out strings.Builder
	for _, si := range st.CachedInfo().Sources {
		site, ok := events.SiteOf(&jetstream.StreamSource{Name: si.Name, External: si.External}, events.StreamOutcomes)
		if !ok || atSite[site] == nil {
			continue
		}
		var last string
		if ss, err := atSite[site].js.Stream(ctx, events.StreamOutcomes); err != nil {
			last = fmt.Sprintf("(not read: %v)", err)
		} else {
			last = strconv.FormatUint(ss.CachedInfo().State.LastSeq, 10)
		}
		fmt.Fprintf(&out, "; the hub's source of %s's outcomes read to %d of the site's %s, last contact %v ago, lag %d",
			site, si.Seq, last, si.Active.Round(time.Millisecond), si.Lag)
		if si.Error != nil {
			fmt.Fprintf(&out, ", error: %v", si.Error)
		}
		// The site's side of the same source: its durable consumer for
		// the hub, acknowledged by the hub's flow control. Delivered
		// past what the hub read is a hub that stopped storing; pending
		// with nothing delivered past it, a consumer that stopped
		// sending.
		if c, err := atSite[site].js.PushConsumer(ctx, events.StreamOutcomes, events.HubSourceConsumer); err != nil {
			fmt.Fprintf(&out, "; the site's consumer for the hub not read: %v", err)
		} else {
			ci := c.CachedInfo()
			fmt.Fprintf(&out, "; the site's consumer for the hub delivered to %d, acknowledged to %d, %d pending, %d awaiting acknowledgement, bound %v, paused %v",
				ci.Delivered.Stream, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending, ci.PushBound, ci.Paused)
		}
	}
	return out.String()
}

// sitesOf is the set of sites ids names.
func sitesOf(ids map[string]string) map[string]bool {
	sites := map[string]bool{}
	for _, site := range ids {
		sites[site] = true
	}
	return sites
}
