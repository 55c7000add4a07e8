package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/sitetest"
	"github.com/steward-dev/steward/workers/workertest"
)

// The configuration `steward site config` writes is one nats-server reads:
// the site's domain, its own store, a persistent name, and a link to the
// hub denying Steward's subjects both ways; with --server-dir, the closed
// bus with the link bound to the account.
func TestSiteConfigIsALeafNodeNATSServerReads(t *testing.T) {
	dir := t.TempDir()
	auth, err := natsauth.LoadOrCreate(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	for name, extra := range map[string][]string{
		"open":   nil,
		"closed": {"--server-dir", filepath.Join(dir, "auth"), "--account", auth.AccountPublic, "--leaf-creds", filepath.Join(dir, "leaf.creds")},
	} {
		t.Run(name, func(t *testing.T) {
			conf := filepath.Join(dir, name+".conf")
			args := append([]string{"site", "config", "site-a", "--hub-url", "nats-leaf://127.0.0.1:7422",
				"--store-dir", filepath.Join(dir, "store-"+name), "--out", conf}, extra...)
			ok(t, nil, args...)
			if err := os.WriteFile(filepath.Join(dir, "leaf.creds"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			o, err := server.ProcessConfigFile(conf)
			if err != nil {
				raw, _ := os.ReadFile(conf)
				t.Fatalf("nats-server refuses the configuration: %v\n%s", err, raw)
			}
			if o.JetStreamDomain != "site-a" || o.ServerName != "steward-site-site-a" || o.StoreDir != filepath.Join(dir, "store-"+name) {
				t.Errorf("domain %q, server name %q, store %q", o.JetStreamDomain, o.ServerName, o.StoreDir)
			}
			if len(o.LeafNode.Remotes) != 1 {
				t.Fatalf("%d remotes, want the hub", len(o.LeafNode.Remotes))
			}
			r := o.LeafNode.Remotes[0]
			if r.URLs[0].String() != "nats-leaf://127.0.0.1:7422" || !r.IgnoreDiscoveredServers {
				t.Errorf("remote %v, ignoring discovered servers %v: want the hub's URL given, and only it", r.URLs, r.IgnoreDiscoveredServers)
			}
			if !slices.Equal(r.DenyImports, events.SiteLinkDenied()) || !slices.Equal(r.DenyExports, events.SiteLinkDenied()) {
				t.Errorf("the link denies imports %v and exports %v, want %v both ways", r.DenyImports, r.DenyExports, events.SiteLinkDenied())
			}
			if name == "closed" {
				if len(o.TrustedOperators) != 1 || r.LocalAccount != auth.AccountPublic || r.Credentials == "" {
					t.Errorf("closed bus: %d operators, link bound to %q with credentials %q", len(o.TrustedOperators), r.LocalAccount, r.Credentials)
				}
			}
			if !o.FeatureFlags["js_api_reply_v2"] {
				t.Errorf("feature flags %v: want js_api_reply_v2, which the leaf identity's permissions rely on", o.FeatureFlags)
			}
		})
	}
}

// `steward creds issue leaf` issues the site's leaf identity from the
// account signing key alone: named for the site, its permissions the
// table's for the site and the hub's domain, with no document key (a leaf
// node signs nothing).
func TestCredsIssueLeafIsTheSitesIdentity(t *testing.T) {
	dir := t.TempDir()
	ok(t, nil, "creds", "init", "--dir", filepath.Join(dir, "auth"))
	out := filepath.Join(dir, "leaf-site-a.creds")
	ok(t, nil, "creds", "issue", "leaf", "site-a", "--hub-domain", "central", "--account-seed", filepath.Join(dir, "auth", natsauth.SigningSeedFile), "--out", out)
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	id, err := natsauth.Leaf("site-a", "central")
	if err != nil {
		t.Fatal(err)
	}
	want := id.Permissions()
	if uc.Name != "leaf-site-a" || !slices.Equal(uc.Pub.Allow, jwt.StringList(want.Publish)) || !slices.Equal(uc.Sub.Allow, jwt.StringList(want.Subscribe)) {
		t.Errorf("leaf credentials: name %q, publish %v, subscribe %v; want leaf-site-a with %+v", uc.Name, uc.Pub.Allow, uc.Sub.Allow, want)
	}
	if !slices.Contains(uc.Pub.Allow, "$JS.central.API.CONSUMER.RESET.STEWARD_EVENTS.site-site-a") {
		t.Errorf("the leaf may not reset its own consumer at the hub's domain: %v", uc.Pub.Allow)
	}
	if _, err := os.Stat(filepath.Join(dir, "leaf-site-a.dockey")); err == nil {
		t.Error("a leaf node got a document key; it signs nothing")
	}
	for _, args := range [][]string{
		{"creds", "issue", "leaf", "site.a", "--account-seed", filepath.Join(dir, "auth", natsauth.SigningSeedFile)},
		{"creds", "issue", "leaf", "hub", "--account-seed", filepath.Join(dir, "auth", natsauth.SigningSeedFile)},
	} {
		if r := run(t, nil, args...); r.code == 0 || !strings.Contains(r.stderr, "leaf identity") {
			t.Errorf("steward %s: exit %d, stderr %q; want a refusal naming the leaf identity", strings.Join(args, " "), r.code, r.stderr)
		}
	}
}

func TestSiteCommandsRefuseBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"site", "config", "site.a", "--hub-url", "nats-leaf://h:7422", "--store-dir", "/tmp/x"}, "site name"},
		{[]string{"site", "config", "site-a", "--hub-url", "http://h", "--store-dir", "/tmp/x"}, "--hub-url"},
		{[]string{"site", "config", "site-a", "--hub-url", "nats-leaf://h:7422"}, "--store-dir"},
		{[]string{"site", "config", "site-a", "--hub-url", "nats-leaf://h:7422", "--store-dir", "/tmp/x", "--server-dir", "/tmp/a", "--account", "AXXX"}, "--leaf-creds"},
		{[]string{"site", "setup", "hub", "--nats-url", "nats://127.0.0.1:1"}, "differ"},
		{[]string{"site", "setup", "site-a", "--hives", "a.b", "--nats-url", "nats://127.0.0.1:1"}, "hive"},
		{[]string{"site", "setup", "site-a", "--nats-url", "nats://127.0.0.1:1"}, "--controller-key"},
	} {
		r := run(t, nil, tc.args...)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("steward %s: exit %d, stderr %q; want a refusal naming %s", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
}

// startEmbedded starts a nats-server from o in this process.
func startEmbedded(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	o.NoLog, o.NoSigs = true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready in 10s")
	}
	return s
}

// A site on the closed bus from the commands alone: the authority from
// creds init, the site's leaf identity from creds issue leaf, the leaf
// node running the configuration site config writes, linked to a hub in
// JWT mode; site setup --site-url makes the site's streams at the site
// and the hub's consumer and sources at the hub; an event published at
// the hub reaches the site, an outcome written at the site reaches the
// hub, and a hub-side read with --js-domain answers under the site's
// inbox prefix.
func TestSiteSetupOnTheClosedBus(t *testing.T) {
	dir := t.TempDir()
	authDir, serverDir := filepath.Join(dir, "auth"), filepath.Join(dir, "server")
	ok(t, nil, "creds", "init", "--dir", authDir, "--server-dir", serverDir)
	auth, err := natsauth.LoadOrCreate(authDir)
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(authDir, natsauth.SigningSeedFile)
	opCreds, leafCreds := filepath.Join(dir, "operator.creds"), filepath.Join(dir, "leaf-site-a.creds")
	ok(t, nil, "creds", "issue", "operator", "--account-seed", seed, "--out", opCreds)
	ok(t, nil, "creds", "issue", "leaf", "site-a", "--account-seed", seed, "--out", leafCreds)

	hubOpts := &server.Options{ServerName: "hub", Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, JetStreamDomain: "hub",
		StoreDir: t.TempDir(), LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: workertest.FreePort(t)},
		FeatureFlags: map[string]bool{"js_api_reply_v2": true}}
	if err := auth.Configure(hubOpts); err != nil {
		t.Fatal(err)
	}
	hub := startEmbedded(t, hubOpts)
	conf := filepath.Join(dir, "site-a.conf")
	ok(t, nil, "site", "config", "site-a", "--hub-url", fmt.Sprintf("nats-leaf://127.0.0.1:%d", hubOpts.LeafNode.Port),
		"--store-dir", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", workertest.FreePort(t)), "--max-file-store", "1GB",
		"--server-dir", serverDir, "--account", auth.AccountPublic, "--leaf-creds", leafCreds, "--out", conf)
	leafOpts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	leaf := startEmbedded(t, leafOpts)
	workertest.WaitUntil(t, "site A's leaf node links to the hub with its leaf identity", func() bool { return hub.NumLeafNodes() == 1 })

	connect := func(url, inbox, domain string) jetstream.JetStream {
		opts := []nats.Option{nats.UserCredentials(opCreds)}
		if inbox != "" {
			opts = append(opts, nats.CustomInboxPrefix(inbox))
		}
		nc, err := nats.Connect(url, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := events.JetStreamIn(nc, domain)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hubJS := connect(hub.ClientURL(), "", "")
	sitetest.SetupBus(ctx, t, hubJS)
	env := []string{"STEWARD_NATS_URL=" + hub.ClientURL(), "STEWARD_NATS_CREDS=" + opCreds}
	limits := []string{"--max-bytes", fmt.Sprint(64 << 20), "--dlq-max-bytes", fmt.Sprint(16 << 20), "--checkpoint-max-bytes", fmt.Sprint(16 << 20)}
	if r := run(t, env, append([]string{"site", "setup", "site-a", "--hives", "hive-1", "--site-url", hub.ClientURL()}, limits...)...); r.code == 0 || !strings.Contains(r.stderr, "not site site-a's leaf node") {
		t.Errorf("site setup with the hub as --site-url: exit %d, stderr %q; want a refusal naming the domain found", r.code, r.stderr)
	}
	ok(t, env, append([]string{"site", "setup", "site-a", "--hives", "hive-1", "--site-url", leaf.ClientURL()}, limits...)...)

	if _, err := hubJS.Publish(ctx, "steward.events.credential.rotated.hive-1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	siteJS := connect(leaf.ClientURL(), "", "site-a")
	fromHub := connect(hub.ClientURL(), events.SiteInboxPrefix("site-a"), "site-a")
	hold := func(js jetstream.JetStream, stream string, want uint64) func() bool {
		return func() bool {
			s, err := js.Stream(ctx, stream)
			return err == nil && s.CachedInfo().State.Msgs == want
		}
	}
	workertest.WaitUntil(t, "the site holds the hub's event", hold(siteJS, events.StreamEvents, 1))
	workertest.WaitUntil(t, "the hub reads it with the site's inbox prefix", hold(fromHub, events.StreamEvents, 1))
	if _, err := siteJS.Publish(ctx, events.OutcomeSubject("credential", "hive-1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "the hub holds the site's outcome", hold(hubJS, events.StreamOutcomes, 1))
	// The hub-side read as a command: steward site status names the site
	// linked and caught up.
	r := ok(t, env, "site", "status", "--json")
	if !strings.Contains(r.stdout, `"site-a"`) {
		t.Errorf("steward site status: %s", r.stdout)
	}
	// Listing a site's documents makes a consumer, which the link does
	// not carry: run at the site, the same command reads them.
	if r := run(t, env, "status", "--js-domain", "site-a", "--json"); r.code == 0 {
		t.Errorf("steward status --js-domain site-a at the hub made a consumer across the link: %s", r.stdout)
	}
	ok(t, []string{"STEWARD_NATS_URL=" + leaf.ClientURL(), "STEWARD_NATS_CREDS=" + opCreds}, "status", "--js-domain", "site-a", "--json")
}

// A tool given --js-domain and no inbox prefix of its own takes the
// site's, the one prefix a site's leaf identity may answer under.
func TestJSDomainTakesTheSitesInboxPrefix(t *testing.T) {
	for _, tc := range []struct {
		g    globals
		want string
	}{
		{globals{jsDomain: "site-a"}, events.SiteInboxPrefix("site-a")},
		{globals{jsDomain: "site-a", natsInbox: "_INBOX.mine"}, "_INBOX.mine"},
		{globals{}, ""}, // nats.go's default, _INBOX
	} {
		opts, err := tc.g.authOptions()
		if err != nil {
			t.Fatal(err)
		}
		o := nats.GetDefaultOptions()
		for _, apply := range opts {
			if err := apply(&o); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.TrimSuffix(o.InboxPrefix, "."); got != strings.TrimSuffix(tc.want, ".") {
			t.Errorf("--js-domain %q --nats-inbox-prefix %q: inbox prefix %q, want %q", tc.g.jsDomain, tc.g.natsInbox, got, tc.want)
		}
	}
}

// At the hub, `steward status` and `steward site status` show the site: its
// link, its lag and the age of the oldest event not sent, and its
// instances; through a cut, down, behind, and its instances unreachable
// with why. Human and JSON say the same.
func TestStatusAtTheHubShowsTheSiteThroughACut(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	hubURL := pair.Hub.ClientURL()
	_, js := sitetest.Connect(t, pair.Hub, "")
	ctx := context.Background()
	sitetest.SetupBus(ctx, t, js)
	opsOK(t, hubURL, newSiteCmd, "setup", "site-a", "--hives", "hive-1", "--max-bytes", "67108864", "--dlq-max-bytes", "16777216", "--checkpoint-max-bytes", "16777216")
	workertest.WaitUntil(t, "the site's leaf node sources through the hub's consumer", func() bool {
		st := decodeJSON[ops.Status](t, opsOK(t, hubURL, newStatusCmd, "-o", "json"))
		return len(st.Sites) == 1 && st.Sites[0].Linked
	})
	out := opsOK(t, hubURL, newStatusCmd)
	if !regexp.MustCompile(`(?m)^site-a\s+yes\s+0\s+-\s+0\s+ok\s+0: none`).MatchString(out) || strings.Contains(out, "warning") {
		t.Errorf("steward status at the hub, the site linked and idle, with nothing to warn of:\n%s", out)
	}

	pair.Cut()
	for v := 1; v <= 2; v++ {
		if _, err := js.Publish(ctx, "steward.events.credential.rotated.hive-1", []byte("{}"), jetstream.WithMsgID(fmt.Sprintf("r-%d", v))); err != nil {
			t.Fatal(err)
		}
	}
	workertest.WaitUntil(t, "the hub sees the site unlinked", func() bool {
		st := decodeJSON[ops.Status](t, opsOK(t, hubURL, newStatusCmd, "-o", "json"))
		return len(st.Sites) == 1 && !st.Sites[0].Linked
	})
	st := decodeJSON[ops.Status](t, opsOK(t, hubURL, newStatusCmd, "-o", "json"))
	s := st.Sites[0]
	if s.Name != "site-a" || s.Pending != 2 || s.OldestPending == nil || s.OldestPendingSeconds <= 0 || s.Unreachable == "" || s.Instances == nil {
		t.Errorf("steward status -o json through the cut: %+v; want site-a 2 behind since the first, unreachable with why", s)
	}
	out = opsOK(t, hubURL, newStatusCmd)
	if !regexp.MustCompile(`(?m)^site-a\s+no\s+2\s+\d+(\.\d+)?m?s\s+\d+\s+(ok|STEWARD_OUTCOMES silent \S+, STEWARD_DLQ silent \S+)\s+unreachable: \S`).MatchString(out) {
		t.Errorf("steward status at the hub through the cut:\n%s", out)
	}
	out = opsOK(t, hubURL, newSiteCmd, "status")
	if !regexp.MustCompile(`(?m)^SITE\s+LINKED\s+PENDING\s+OLDEST PENDING`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^site-a\s+no\s+2\s+\d+(\.\d+)?m?s\s`).MatchString(out) {
		t.Errorf("steward site status through the cut:\n%s", out)
	}
	sites := decodeJSON[[]ops.Site](t, opsOK(t, hubURL, newSiteCmd, "status", "-o", "json"))
	if len(sites) != 1 || sites[0].OldestPending == nil || !sites[0].OldestPending.Equal(*s.OldestPending) {
		t.Errorf("steward site status -o json: %+v, want the same oldest event as steward status", sites)
	}
}

// The two-site example's leaf node configurations are exactly what
// `steward site config` writes, so the example cannot drift from the
// command: regenerate them with the command in the failure.
func TestDeploySitesLeafConfigsAreSiteConfigsOutput(t *testing.T) {
	for _, site := range []string{"site-a", "site-b"} {
		args := []string{"config", site, "--hub-url", "nats-leaf://hub:7422", "--listen", "0.0.0.0:4222", "--http-listen", "0.0.0.0:8222", "--store-dir", "/data"}
		want := opsOK(t, "", newSiteCmd, args...)
		path := filepath.Join("..", "..", "deploy", "sites", site+".conf")
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s differs from what steward site config writes; regenerate it:\n  go run ./cmd/steward site %s --out deploy/sites/%s.conf", path, strings.Join(args, " "), site)
		}
	}
}

// `steward site setup` started before the site's leaf node is linked (as a
// compose project starts them together) waits for it, and sets it up.
func TestSiteSetupWaitsForTheLeafNode(t *testing.T) {
	pair := sitetest.Start(t, "site-a")
	hubURL := pair.Hub.ClientURL()
	nc, js := sitetest.Connect(t, pair.Hub, "")
	sitetest.SetupBus(context.Background(), t, js)
	pair.Cut()
	type result struct {
		stderr string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		_, errOut, err := opsRun(t, hubURL, newSiteCmd, "setup", "site-a", "--hives", "hive-1", "--max-bytes", "67108864", "--dlq-max-bytes", "16777216", "--checkpoint-max-bytes", "16777216")
		done <- result{errOut, err}
	}()
	// The setup has been refused by the unlinked site at least once when
	// the hub holds its consumer (made first) and the site no stream.
	workertest.WaitUntil(t, "the setup has made the hub's consumer for the site", func() bool {
		sites, err := ops.Sites(context.Background(), js)
		return err == nil && len(sites) == 1
	})
	pair.Restart()
	r := <-done
	if r.err != nil {
		t.Fatalf("steward site setup, the leaf node linked while it waited: %v", r.err)
	}
	if strings.Contains(r.stderr, "warning") {
		t.Errorf("a new site's set-up warned:\n%s", r.stderr)
	}
	site, err := events.JetStreamIn(nc, "site-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := site.Stream(context.Background(), events.StreamEvents); err != nil {
		t.Errorf("the site has no %s after the setup: %v", events.StreamEvents, err)
	}
}

// A site whose events stream an earlier set-up made async is set up again
// (nats-server cannot change a persist mode), and the operator is told
// what that stream risks and how to stop its leaf node meanwhile.
func TestSiteSetupWarnsOfAnAsyncEventsStream(t *testing.T) {
	pair, nc, js, cfg := startSiteHub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	site := events.Site{Name: "site-a", HubDomain: events.DefaultHubDomain, Hives: []string{"hive-1"}}
	siteJS, err := events.JetStreamIn(nc, "site-a")
	if err != nil {
		t.Fatal(err)
	}
	sitetest.MakeAsyncSiteEvents(ctx, t, js, siteJS, cfg, site)
	out, errOut, err := opsRun(t, pair.Hub.ClientURL(), newSiteCmd, append([]string{"setup", "site-a", "--hives", "hive-1"}, siteSetupLimits(cfg)...)...)
	if err != nil {
		t.Fatalf("steward site setup over an async events stream: %v\nstderr:\n%s", err, errOut)
	}
	for _, want := range []string{"warning: site site-a", "persist_mode async", "SIGTERM"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(out, "site site-a: STEWARD_OUTCOMES, STEWARD_DLQ and bucket") {
		t.Errorf("stdout does not report the set-up done:\n%s", out)
	}
	// And every `steward status` at the hub says it again.
	workertest.WaitUntil(t, "steward status reads the site's instances", func() bool {
		st := decodeJSON[ops.Status](t, opsOK(t, pair.Hub.ClientURL(), newStatusCmd, "-o", "json"))
		return len(st.Sites) == 1 && st.Sites[0].Unreachable == ""
	})
	st := decodeJSON[ops.Status](t, opsOK(t, pair.Hub.ClientURL(), newStatusCmd, "-o", "json"))
	if w := st.Sites[0].Warning; !strings.Contains(w, "site site-a") || !strings.Contains(w, "persist_mode async") {
		t.Errorf("steward status -o json: the site's warning is %q, want its events stream named async", w)
	}
	if st.ServerWarning != "" {
		t.Errorf("steward status -o json at a hub on nats-server %s warns of the server: %q", st.ServerVersion, st.ServerWarning)
	}
	if out := opsOK(t, pair.Hub.ClientURL(), newStatusCmd); !regexp.MustCompile(`(?m)^warning: site site-a: .*persist_mode async`).MatchString(out) {
		t.Errorf("steward status at the hub does not warn of the site's async events stream:\n%s", out)
	}
}

// startSiteHub starts a hub and site-a's leaf node, and sets Steward's
// bus up at the hub as `steward setup` does; it returns the pair, a
// connection to the hub with its JetStream, and the bus's configuration.
func startSiteHub(t *testing.T) (*sitetest.Pair, *nats.Conn, jetstream.JetStream, events.BusConfig) {
	t.Helper()
	pair := sitetest.Start(t, "site-a")
	nc, js := sitetest.Connect(t, pair.Hub, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pair, nc, js, sitetest.SetupBus(ctx, t, js)
}

// siteSetupLimits are the flags that give `steward site setup` the
// limits cfg set the hub's bus up with.
func siteSetupLimits(cfg events.BusConfig) []string {
	return []string{"--max-bytes", strconv.FormatInt(cfg.Streams.MaxBytes, 10), "--dlq-max-bytes", strconv.FormatInt(cfg.Streams.DLQMaxBytes, 10),
		"--checkpoint-max-bytes", strconv.FormatInt(cfg.CheckpointMaxBytes, 10)}
}

// A hub and a leaf node on a nats-server older than
// events.MinSiteServerVersion, seen through a proxy that reports 2.15.2 in
// every INFO each one sends: site setup sets the site up and warns of each end,
// naming it, its version and the upgrade, and `steward status` at the hub
// says it again in its JSON and under its NATS line. The same set-up
// straight to the servers warns of neither.
func TestSiteSetupAndStatusWarnOfAnOlderServer(t *testing.T) {
	pair, _, _, cfg := startSiteHub(t)
	// setup sets site-a up through hubURL and siteURL, and returns what it
	// said on stderr.
	setup := func(hubURL, siteURL string) string {
		t.Helper()
		out, errOut, err := opsRun(t, hubURL, newSiteCmd, append([]string{"setup", "site-a", "--hives", "hive-1", "--site-url", siteURL}, siteSetupLimits(cfg)...)...)
		if err != nil {
			t.Fatalf("steward site setup at %s and %s: %v\nstderr:\n%s", hubURL, siteURL, err, errOut)
		}
		if !strings.Contains(out, "site site-a: STEWARD_OUTCOMES, STEWARD_DLQ and bucket") {
			t.Errorf("stdout does not report the set-up done:\n%s", out)
		}
		return errOut
	}

	if errOut := setup(pair.Hub.ClientURL(), pair.Leaf.ClientURL()); strings.Contains(errOut, "nats-server") {
		t.Errorf("site setup on nats-server %s warns of the server:\n%s", server.VERSION, errOut)
	}

	oldHub, oldLeaf := sitetest.OlderServer(t, pair.Hub, "2.15.2"), sitetest.OlderServer(t, pair.Leaf, "2.15.2")
	errOut := setup(oldHub, oldLeaf)
	for _, want := range []string{
		"warning: the hub at " + oldHub + " runs nats-server 2.15.2",
		"warning: site site-a's leaf node at " + oldLeaf + " runs nats-server 2.15.2",
	} {
		if !strings.Contains(errOut, want+": "+events.ErrSiteServerTooOld.Error()) {
			t.Errorf("site setup through servers reporting 2.15.2: stderr does not say %q:\n%s", want, errOut)
		}
	}
	if n := strings.Count(errOut, "upgrade the hub and every leaf node to "+events.MinSiteServerVersion); n != 2 {
		t.Errorf("site setup names the upgrade %d times, want once for each end:\n%s", n, errOut)
	}

	workertest.WaitUntil(t, "steward status at the hub lists the site", func() bool {
		return len(decodeJSON[ops.Status](t, opsOK(t, oldHub, newStatusCmd, "-o", "json")).Sites) == 1
	})
	st := decodeJSON[ops.Status](t, opsOK(t, oldHub, newStatusCmd, "-o", "json"))
	if st.ServerVersion != "2.15.2" || !strings.Contains(st.ServerWarning, "the hub at "+oldHub+" runs nats-server 2.15.2") {
		t.Errorf("steward status -o json at a hub reporting 2.15.2: serverVersion %q, serverWarning %q; want the hub named with its version", st.ServerVersion, st.ServerWarning)
	}
	if out := opsOK(t, oldHub, newStatusCmd); !regexp.MustCompile(`(?m)^NATS .*\n\s*warning: the hub at \S+ runs nats-server 2\.15\.2`).MatchString(out) {
		t.Errorf("steward status at a hub reporting 2.15.2 does not warn under its NATS line:\n%s", out)
	}
}
