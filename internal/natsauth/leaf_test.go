package natsauth_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers/workertest"
)

// replyV2 is nats-server's feature flag that scopes the reply subjects of
// the server's own JetStream requests to their target's domain, which the
// leaf identity's permissions rely on.
const replyV2 = "js_api_reply_v2"

// violations records the permission violations a server logs.
type violations struct {
	mu    sync.Mutex
	lines []string
}

func (v *violations) record(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	if strings.Contains(line, "Violation") {
		v.mu.Lock()
		v.lines = append(v.lines, line)
		v.mu.Unlock()
	}
}

func (v *violations) Noticef(format string, args ...any) { v.record(format, args...) }
func (v *violations) Warnf(format string, args ...any)   { v.record(format, args...) }
func (v *violations) Fatalf(format string, args ...any)  { v.record(format, args...) }
func (v *violations) Errorf(format string, args ...any)  { v.record(format, args...) }
func (v *violations) Debugf(format string, args ...any)  {}
func (v *violations) Tracef(format string, args ...any)  {}

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.lines...)
}

// siteFleet is a hub and two sites on the closed bus as `steward site
// config` writes it: the hub in JWT mode in domain hub, each site a leaf
// node in its own domain, trusting the same operator, linked with its own
// leaf identity's credentials and bound to the STEWARD account, the link
// denying Steward's subjects; every server with js_api_reply_v2.
type siteFleet struct {
	a        *natsauth.Authority
	dir      string
	hub      *server.Server
	leafAddr string
	sites    map[string]*server.Server
	log      *violations
	// siteOpts are each site's leaf node's options, its store kept, and
	// start starts a server from options: a site's leaf node restarts.
	siteOpts map[string]func() *server.Options
	start    func(*server.Options) *server.Server
	cfg      events.BusConfig
	hubJS    jetstream.JetStream
	opCreds  string
}

var fleetSites = map[string]events.Site{
	"site-a": {Name: "site-a", HubDomain: "hub", Hives: []string{"hive-a1"}},
	"site-b": {Name: "site-b", HubDomain: "hub", Hives: []string{"hive-b1"}},
}

func startSiteFleet(t *testing.T) *siteFleet {
	t.Helper()
	dir := t.TempDir()
	a, err := natsauth.LoadOrCreate(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	f := &siteFleet{a: a, dir: dir, sites: map[string]*server.Server{}, siteOpts: map[string]func() *server.Options{}, log: &violations{}}
	start := func(o *server.Options) *server.Server {
		o.Host, o.Port, o.JetStream, o.NoSigs = "127.0.0.1", server.RANDOM_PORT, true, true
		if o.StoreDir == "" {
			o.StoreDir = t.TempDir()
		}
		o.FeatureFlags = map[string]bool{replyV2: true}
		if err := a.Configure(o); err != nil {
			t.Fatal(err)
		}
		s, err := server.NewServer(o)
		if err != nil {
			t.Fatal(err)
		}
		s.SetLogger(f.log, false, false)
		s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats server not ready in 10s")
		}
		return s
	}
	leafPort := workertest.FreePort(t)
	f.leafAddr = fmt.Sprintf("127.0.0.1:%d", leafPort)
	f.hub = start(&server.Options{ServerName: "hub", JetStreamDomain: "hub", LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort}})
	u, err := url.Parse("nats-leaf://" + f.leafAddr)
	if err != nil {
		t.Fatal(err)
	}
	for name, site := range fleetSites {
		id, err := natsauth.Leaf(name, site.HubDomain)
		if err != nil {
			t.Fatal(err)
		}
		creds, store, deny := f.credsOf(t, id), t.TempDir(), events.SiteLinkDenied()
		f.siteOpts[name] = func() *server.Options {
			return &server.Options{ServerName: "steward-site-" + name, JetStreamDomain: name, StoreDir: store, LeafNode: server.LeafNodeOpts{
				ReconnectInterval: 100 * time.Millisecond,
				Remotes: []*server.RemoteLeafOpts{{URLs: []*url.URL{u}, Credentials: creds, LocalAccount: a.AccountPublic,
					DenyImports: deny, DenyExports: deny}},
			}}
		}
		f.sites[name] = start(f.siteOpts[name]())
	}
	f.start = start
	workertest.WaitUntil(t, "both sites are linked", func() bool { return f.hub.NumLeafNodes() == 2 })
	f.opCreds = f.credsOf(t, natsauth.Operator())

	// The operator sets the hub and each site up: the site's streams at
	// the site's own leaf node, the hub's consumer and sources at the hub.
	f.cfg = events.DefaultBusConfig(1)
	f.cfg.Streams.MaxBytes, f.cfg.Streams.DLQMaxBytes, f.cfg.CheckpointMaxBytes = 64<<20, 16<<20, 16<<20
	_, f.hubJS = f.operator(t, f.hub, "", "")
	if err := events.SetupBus(ctx(t), f.hubJS, f.cfg); err != nil {
		t.Fatal(err)
	}
	for name, site := range fleetSites {
		_, siteJS := f.operator(t, f.sites[name], "", name)
		if err := events.SetupSite(ctx(t), siteJS, f.hubJS, f.cfg, site); err != nil {
			t.Fatalf("set up %s: %v", name, err)
		}
	}
	return f
}

// credsOf writes id's credentials into the fleet's folder.
func (f *siteFleet) credsOf(t *testing.T, id natsauth.Identity) string {
	t.Helper()
	path := filepath.Join(f.dir, id.Name()+".creds")
	if err := f.a.WriteCreds(path, id); err != nil {
		t.Fatal(err)
	}
	return path
}

// operator connects to s as the operator with inbox prefix inbox (empty:
// _INBOX), its JetStream in domain.
func (f *siteFleet) operator(t *testing.T, s *server.Server, inbox, domain string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts := []nats.Option{nats.UserCredentials(f.opCreds)}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := events.JetStreamIn(nc, domain)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// count is how many messages stream holds in js.
func count(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx(t), stream)
	if err != nil {
		t.Fatalf("stream %s: %v", stream, err)
	}
	return s.CachedInfo().State.Msgs
}

// waitCount waits until stream holds want messages.
func waitCount(t *testing.T, js jetstream.JetStream, stream string, want uint64, what string) {
	t.Helper()
	workertest.WaitUntil(t, what, func() bool {
		s, err := js.Stream(ctx(t), stream)
		return err == nil && s.CachedInfo().State.Msgs == want
	})
}

// TestLeafIdentityCarriesWhatASiteNeeds proves the leaf identity's
// permissions are not too narrow: on the closed bus, with each site's
// link under its own leaf credentials, each site receives its keys'
// events, the hub sources each site's outcomes and dead letters, a
// hub-side tool reads a site's JetStream with the site's inbox prefix, and
// no server logs a permission violation.
func TestLeafIdentityCarriesWhatASiteNeeds(t *testing.T) {
	f := startSiteFleet(t)
	for _, hive := range []string{"hive-a1", "hive-b1"} {
		if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated."+hive, []byte(`{}`), jetstream.WithMsgID("e-"+hive)); err != nil {
			t.Fatal(err)
		}
	}
	for name := range fleetSites {
		_, siteJS := f.operator(t, f.sites[name], "", name)
		waitCount(t, siteJS, events.StreamEvents, 1, name+" holds its one event")
		hive := fleetSites[name].Hives[0]
		if _, err := siteJS.Publish(ctx(t), events.OutcomeSubject("credential", hive), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := siteJS.Publish(ctx(t), events.DLQSubject("credential", hive), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		// A hub-side tool reaching the site, as `--js-domain` does.
		_, fromHub := f.operator(t, f.hub, events.SiteInboxPrefix(name), name)
		if n := count(t, fromHub, events.StreamEvents); n != 1 {
			t.Errorf("the hub reads %d events in %s's stream, want 1", n, name)
		}
	}
	waitCount(t, f.hubJS, events.StreamOutcomes, 2, "the hub holds both sites' outcomes")
	waitCount(t, f.hubJS, events.StreamDLQ, 2, "the hub holds both sites' dead letters")
	if v := f.log.all(); len(v) != 0 {
		t.Fatalf("the servers refused what sites need: %q", v)
	}
	// The link did not fall back to anything the identity is not allowed:
	// the hub's sources deliver under the site's own prefix.
	st, err := f.hubJS.Stream(ctx(t), events.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range st.CachedInfo().Sources {
		if src.Error != nil {
			t.Errorf("the hub's source %s: %v", src.Name, src.Error)
		}
	}
}

// rawLeaf is a leaf connection spoken by hand with a site's leaf
// credentials: what whoever holds them (a compromised site) can send the
// hub, beyond what an honest nats-server would forward.
type rawLeaf struct {
	conn  net.Conn
	mu    sync.Mutex
	lines []string
}

func dialLeaf(t *testing.T, addr, creds string) *rawLeaf {
	t.Helper()
	raw, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := jwt.ParseDecoratedUserNKey(raw)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("the hub's leaf port said %q (%v), want INFO", line, err)
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "INFO ")), &info); err != nil {
		t.Fatal(err)
	}
	sig, err := kp.Sign([]byte(info.Nonce))
	if err != nil {
		t.Fatal(err)
	}
	connect, err := json.Marshal(map[string]any{"jwt": token, "sig": base64.RawURLEncoding.EncodeToString(sig),
		"name": "raw-leaf", "headers": true, "protocol": 1})
	if err != nil {
		t.Fatal(err)
	}
	l := &rawLeaf{conn: conn}
	go func() {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if strings.HasPrefix(line, "PING") {
				_, _ = conn.Write([]byte("PONG\r\n"))
			}
			l.mu.Lock()
			l.lines = append(l.lines, strings.TrimSpace(line))
			l.mu.Unlock()
		}
	}()
	if _, err := fmt.Fprintf(conn, "CONNECT %s\r\nPING\r\n", connect); err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "the hub accepts the leaf credentials", func() bool { return l.saw("PONG") })
	if l.saw("-ERR") {
		t.Fatalf("the hub refused the leaf credentials: %q", l.all())
	}
	return l
}

func (l *rawLeaf) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (l *rawLeaf) saw(prefix string) bool {
	for _, line := range l.all() {
		if strings.HasPrefix(line, prefix) {
			return true
		}
	}
	return false
}

// send sends a message into the hub as the leaf, with reply subject reply
// when it is not empty.
func (l *rawLeaf) send(t *testing.T, subject, reply string, body []byte) {
	t.Helper()
	args := subject
	if reply != "" {
		args += " " + reply
	}
	if _, err := fmt.Fprintf(l.conn, "LMSG %s %d\r\n%s\r\n", args, len(body), body); err != nil {
		t.Fatal(err)
	}
}

// refused waits for the hub to refuse the leaf's publish to subject (it
// then closes the link). The hub names the subject after its domain
// mapping, $JS.hub.API.… as $JS.API.….
func (l *rawLeaf) refused(t *testing.T, subject string) {
	t.Helper()
	var want []string
	for _, s := range []string{subject, strings.Replace(subject, "$JS.hub.API.", "$JS.API.", 1)} {
		want = append(want, fmt.Sprintf("-ERR 'Permissions Violation for Publish to %q'", s))
	}
	workertest.WaitUntil(t, "the hub refuses the leaf's publish to "+subject, func() bool {
		for _, line := range l.all() {
			if slices.Contains(want, line) {
				return true
			}
		}
		return false
	})
}

// snapshot is what the attacks must not change: every stream's count at
// the hub and at each site, and the hub's consumer for each site.
type snapshot map[string]uint64

func (f *siteFleet) snapshot(t *testing.T) snapshot {
	t.Helper()
	s := snapshot{}
	streams := []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ, "KV_" + events.CheckpointBucket}
	for _, name := range streams {
		s["hub "+name] = count(t, f.hubJS, name)
	}
	for site, srv := range f.sites {
		_, js := f.operator(t, srv, "", site)
		for _, name := range streams {
			s[site+" "+name] = count(t, js, name)
		}
		c, err := f.hubJS.PushConsumer(ctx(t), events.StreamEvents, events.SiteConsumer(site))
		if err != nil {
			t.Fatal(err)
		}
		s["hub consumer "+site+" delivered"] = c.CachedInfo().Delivered.Stream
		s["hub consumer "+site+" ack floor"] = c.CachedInfo().AckFloor.Stream
	}
	return s
}

// TestASiteCannotReachAnotherSiteOrTheHubsState is the leaf identity's
// table as attacks: with site A's leaf credentials, a connection spoken by
// hand (so nothing an honest leaf node would filter stands in the way)
// publishes into site B's delivery, flow control, sources and JetStream,
// into the hub's events, outcomes, bucket and JetStream, and into site B's
// answers. The hub refuses each (and drops the link), and no stream or
// bucket at the hub or either site changes.
func TestASiteCannotReachAnotherSiteOrTheHubsState(t *testing.T) {
	f := startSiteFleet(t)
	if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated.hive-b1", []byte(`{}`), jetstream.WithMsgID("e-b1")); err != nil {
		t.Fatal(err)
	}
	_, siteB := f.operator(t, f.sites["site-b"], "", "site-b")
	waitCount(t, siteB, events.StreamEvents, 1, "site B holds its event")
	// Site B confirms the event to the hub's consumer after storing it, so
	// the snapshot waits for that confirmation: taken between the two, it
	// would see the ack floor move with no attack behind it.
	workertest.WaitUntil(t, "the hub's consumer for site B has its event confirmed", func() bool {
		c, err := f.hubJS.PushConsumer(ctx(t), events.StreamEvents, events.SiteConsumer("site-b"))
		return err == nil && c.CachedInfo().AckFloor.Stream == 1
	})
	before := f.snapshot(t)
	leafA := filepath.Join(f.dir, "leaf-site-a.creds")

	for _, subject := range []string{
		// Site B's: its events as the hub delivers them, its flow control
		// (confirming events it never stored), a reset of its consumer
		// (moving it past events), its sources' deliveries, its answers
		// to the hub, its JetStream.
		events.SiteDeliverSubject("site-b"),
		"$JS.FC." + events.StreamEvents + "." + events.SiteConsumer("site-b") + ".x1",
		"$JS.hub.API.CONSUMER.RESET." + events.StreamEvents + "." + events.SiteConsumer("site-b"),
		events.SiteSourcedSubject("site-b", events.StreamOutcomes),
		events.SiteInboxPrefix("site-b") + ".x1.1",
		"$JSC.R.site-b.h.STEWARD_OUTCOMES.hub.x1",
		"$JS.site-b.API.STREAM.PURGE." + events.StreamEvents,
		"$JS.site-b.API.STREAM.DELETE." + events.StreamOutcomes,
		// The hub's: Steward's subjects, its bucket, its JetStream, and
		// the hub's own consumer for site A beyond a reset.
		"steward.events.credential.rotated.hive-b1",
		"steward.outcomes.credential.hive-b1",
		"steward.dlq.credential.hive-b1",
		"$KV." + events.CheckpointBucket + ".cp.credential.hive-b1.credential.rotated.hive-b1",
		"$JS.hub.API.STREAM.PURGE." + events.StreamEvents,
		"$JS.hub.API.CONSUMER.DELETE." + events.StreamEvents + "." + events.SiteConsumer("site-a"),
		"$JS.API.STREAM.PURGE." + events.StreamEvents,
		"_INBOX.operator.x1",
	} {
		l := dialLeaf(t, f.leafAddr, leafA)
		l.send(t, subject, "", []byte(`{}`))
		l.refused(t, subject)
	}
	if after := f.snapshot(t); !mapsEqual(before, after) {
		t.Fatalf("site A's refused publishes changed state:\nbefore %v\nafter  %v", before, after)
	}
	if f.hub.NumLeafNodes() < 2 {
		// Only the attacking connections were dropped.
		workertest.WaitUntil(t, "both sites stay linked", func() bool { return f.hub.NumLeafNodes() == 2 })
	}
}

func mapsEqual(a, b snapshot) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestReflectionAcrossTheLinkLandsNothingBelieved is the one request a
// site must send the hub, the reset of its own consumer, with the reply
// subject chosen by whoever holds site A's leaf credentials: nats-server
// never checks a reply subject, and the hub's JetStream answers to it
// inside the one account. Aimed at site B's JetStream API, it reaches
// nothing (the hub forwards a site only the API requests its sources
// make, and a reflected answer is not one of them); aimed at stored
// subjects, the answer lands, and is believed nowhere: in the hub's
// bucket it does not verify (docs/design.md §7); on site B's event
// subject it is no event, so site B's workers dead-letter it; on an
// outcome subject it carries no proof.
func TestReflectionAcrossTheLinkLandsNothingBelieved(t *testing.T) {
	f := startSiteFleet(t)
	leafA := filepath.Join(f.dir, "leaf-site-a.creds")
	reset := "$JS.hub.API.CONSUMER.RESET." + events.StreamEvents + "." + events.SiteConsumer("site-a")
	_, siteB := f.operator(t, f.sites["site-b"], "", "site-b")

	// Site B's JetStream: a purge and a delete, which need no body.
	if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated.hive-b1", []byte(`{}`), jetstream.WithMsgID("e-b1")); err != nil {
		t.Fatal(err)
	}
	waitCount(t, siteB, events.StreamEvents, 1, "site B holds its event")
	before := f.snapshot(t)
	l := dialLeaf(t, f.leafAddr, leafA)
	for _, reply := range []string{
		"$JS.site-b.API.STREAM.PURGE." + events.StreamEvents,
		"$JS.site-b.API.STREAM.DELETE." + events.StreamOutcomes,
		"$JS.site-b.API.CONSUMER.DELETE." + events.StreamOutcomes + ".x",
		events.SiteDeliverSubject("site-b"),
	} {
		l.send(t, reset, reply, nil)
	}
	// A reset of site A's consumer is answered: the PING after it comes
	// back once the hub has handled the reflections.
	if _, err := fmt.Fprintf(l.conn, "PING\r\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated.hive-b1", []byte(`{}`), jetstream.WithMsgID("e-b2")); err != nil {
		t.Fatal(err)
	}
	waitCount(t, siteB, events.StreamEvents, 2, "site B holds its event and the one published after the reflections")
	after := f.snapshot(t)
	for _, k := range []string{"site-b " + events.StreamOutcomes, "site-b " + events.StreamDLQ, "site-b KV_" + events.CheckpointBucket} {
		if after[k] != before[k] {
			t.Errorf("%s: %d messages before the reflections, %d after", k, before[k], after[k])
		}
	}
	if l.saw("-ERR") {
		t.Fatalf("the hub refused site A's reset of its own consumer: %q", l.all())
	}

	// Stored subjects of site B and of the hub: each reflection lands.
	bucketKey := events.CheckpointKey("credential", "hive-b1", events.TypeCredentialRotated, "hive-b1")
	targets := map[string]string{
		"steward.events.credential.rotated.hive-b1":        events.StreamEvents,
		events.OutcomeSubject("credential", "hive-b1"):     events.StreamOutcomes,
		"$KV." + events.CheckpointBucket + "." + bucketKey: "KV_" + events.CheckpointBucket,
	}
	for reply := range targets {
		l.send(t, reset, reply, nil)
	}
	hubStreams := map[string]uint64{}
	for _, stream := range targets {
		hubStreams[stream] = count(t, f.hubJS, stream)
	}
	workertest.WaitUntil(t, "the reflected answers land at the hub", func() bool {
		for reply, stream := range targets {
			s, err := f.hubJS.Stream(ctx(t), stream)
			if err != nil {
				return false
			}
			if _, err := s.GetLastMsgForSubject(ctx(t), reply); err != nil {
				return false
			}
		}
		return true
	})

	// On site B's event subject: sourced to site B, and no event.
	workertest.WaitUntil(t, "the reflected answer reaches site B", func() bool {
		s, err := siteB.Stream(ctx(t), events.StreamEvents)
		return err == nil && s.CachedInfo().State.Msgs == 3
	})
	st, err := siteB.Stream(ctx(t), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx(t), "steward.events.credential.rotated.hive-b1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.Decode(m.Header, m.Data); err == nil {
		t.Fatalf("the reflected answer at site B decodes as an event: %s", m.Data)
	}
	// It names who reflected it: the consumer it answers for is site A's.
	if !strings.Contains(string(m.Data), events.SiteConsumer("site-a")) {
		t.Errorf("the reflected answer does not name site A's consumer: %s", m.Data)
	}

	// In the hub's bucket: a document that does not verify.
	v := proof.NewVerifier()
	v.TrustIssuer(f.a.AccountPublic)
	store, err := events.OpenStore(ctx(t), f.hubJS, events.StoreOptions{Verifier: v, Domain: "hub"})
	if err != nil {
		t.Fatal(err)
	}
	doc, err := store.Get(ctx(t), bucketKey)
	if err != nil {
		t.Fatal(err)
	}
	if !doc.Present() || doc.Trusted || doc.Forgery == nil {
		t.Fatalf("the reflected answer under %s: present %v, trusted %v, forgery %v; want present and forged", bucketKey, doc.Present(), doc.Trusted, doc.Forgery)
	}

	// On the hub's outcome subject: no proof, so never the instance's.
	outcomes, err := f.hubJS.Stream(ctx(t), events.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	om, err := outcomes.GetLastMsgForSubject(ctx(t), events.OutcomeSubject("credential", "hive-b1"))
	if err != nil {
		t.Fatal(err)
	}
	if om.Header.Get(proof.Header) != "" {
		t.Fatalf("the reflected outcome carries a proof: %v", om.Header)
	}
	t.Logf("reflected through site A's own reset: %d at the hub (events, outcomes, bucket), 1 sourced to site B, none believed; 0 reached site B's JetStream API", len(targets))
}

// TestAHubIdentityCannotReflectIntoASitesJetStream is reflection from the
// hub's side: a worker instance at the hub, issued as users issue them,
// stores under its own keys the bodies of requests (an empty one, a purge
// of everything, a reset to sequence 1000) and asks for a direct get of
// each with a site's JetStream API as the reply subject. The hub's
// JetStream would answer with the body the worker shaped, and a leaf
// connection would turn it into a request at the site (docs/design.md §7).
// nats-server 2.15.3 refuses a client's publish whose reply is a
// JetStream subject ($JS.…), so each is refused at the worker's own
// connection; the leaf identity carries none of these subjects either, so
// site B's streams and consumers are as they were, and site B's next
// outcome reaches the hub.
func TestAHubIdentityCannotReflectIntoASitesJetStream(t *testing.T) {
	f := startSiteFleet(t)
	if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated.hive-b1", []byte(`{}`), jetstream.WithMsgID("e-b1")); err != nil {
		t.Fatal(err)
	}
	_, siteB := f.operator(t, f.sites["site-b"], "", "site-b")
	waitCount(t, siteB, events.StreamEvents, 1, "site B holds its event")
	if _, err := siteB.Publish(ctx(t), events.OutcomeSubject("credential", "hive-b1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, f.hubJS, events.StreamOutcomes, 1, "the hub holds site B's outcome")
	before := f.snapshot(t)

	id, err := natsauth.Worker("credential", "hub-x")
	if err != nil {
		t.Fatal(err)
	}
	w := f.connectAs(t, id)
	kv := "$KV." + natsauth.CheckpointBucket + "."
	direct := "$JS.API.DIRECT.GET.KV_" + natsauth.CheckpointBucket + "." + kv
	bodies := map[string]string{"empty": "", "all": `{}`, "ahead": `{"seq":1000}`, "next": `{"seq":3}`}
	for name, body := range bodies {
		if _, err := w.js.Publish(ctx(t), kv+"cp.credential.hub-x."+name, []byte(body)); err != nil {
			t.Fatalf("the worker writes its own key: %v", err)
		}
	}
	reflect := func(body, target string) {
		t.Helper()
		w.refused(t, "a direct get with "+target+" as its reply", target, func() error {
			return w.nc.PublishRequest(direct+"cp.credential.hub-x."+body, target, nil)
		})
	}
	// Site B's API is watched from the site's side, so a reflection that
	// got through would be seen arriving, not only by what it changed.
	bnc, _ := f.operator(t, f.sites["site-b"], "", "site-b")
	spy, err := bnc.SubscribeSync("$JS.API.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := bnc.Flush(); err != nil {
		t.Fatal(err)
	}
	b := "$JS.site-b.API."
	reflect("all", b+"STREAM.PURGE."+events.StreamEvents)
	reflect("empty", b+"STREAM.DELETE."+events.StreamDLQ)
	reflect("empty", b+"CONSUMER.DELETE."+events.StreamOutcomes+"."+events.HubSourceConsumer)
	reflect("all", b+"STREAM.UPDATE."+events.StreamEvents)
	reflect("next", b+"CONSUMER.RESET."+events.StreamOutcomes+"."+events.HubSourceConsumer)
	reflect("ahead", "$JS.API.CONSUMER.RESET."+events.StreamEvents+"."+events.SiteConsumer("site-b"))
	reflect("ahead", "$JS.hub.API.CONSUMER.RESET."+events.StreamEvents+"."+events.SiteConsumer("site-b"))

	// A marker after the reflections: once site B holds it, whatever the
	// reflections were going to do at site B has been done.
	if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated.hive-b1", []byte(`{}`), jetstream.WithMsgID("e-b2")); err != nil {
		t.Fatal(err)
	}
	waitCount(t, siteB, events.StreamEvents, 2, "site B holds its event and the one after the reflections (a purge or delete reflected into its JetStream leaves fewer)")
	after := f.snapshot(t)
	for k, v := range before {
		if k == "site-b "+events.StreamEvents || strings.HasPrefix(k, "hub consumer site-b") || k == "hub "+events.StreamEvents {
			continue // the marker moved these by one
		}
		if k == "hub KV_"+events.CheckpointBucket {
			continue // the worker's own keys
		}
		if after[k] != v {
			t.Errorf("%s: %d before the reflections, %d after", k, v, after[k])
		}
	}
	if got, want := after["hub consumer site-b delivered"], before["hub consumer site-b delivered"]+1; got != want {
		t.Errorf("the hub's consumer for site B delivered up to %d, want %d: a reflected reset moved it", got, want)
	}
	if _, err := siteB.Publish(ctx(t), events.OutcomeSubject("credential", "hive-b1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, f.hubJS, events.StreamOutcomes, 2, "site B's outcome after the reflections reaches the hub")
	// The spy sees the site's own reads and the hub's resets of site B's
	// consumers for its sources, always without a body; a purge, a
	// deletion, an update or a reset with a body is a reflection.
	for {
		m, err := spy.NextMsg(0)
		if err != nil {
			break
		}
		changes := strings.Contains(m.Subject, ".PURGE.") || strings.Contains(m.Subject, ".DELETE.") || strings.Contains(m.Subject, ".UPDATE.")
		if changes || strings.Contains(m.Subject, ".RESET.") && len(m.Data) > 0 {
			t.Errorf("a reflected request reached site B's API on %s: %q", m.Subject, m.Data)
		}
	}
}

// connectAs connects id to the fleet's hub with credentials issued as
// users issue them.
func (f *siteFleet) connectAs(t *testing.T, id natsauth.Identity) *client {
	t.Helper()
	s := &authServer{srv: f.hub, a: f.a, dir: f.dir}
	return s.connect(t, id)
}

// TestALeafsAcknowledgementsAreChecked is the acknowledgement, with site
// A's leaf credentials, of an event a hub worker's consumer delivered and
// the worker has not settled. nats-server 2.15.2 let a leaf's $JS.ACK
// subjects through whatever its permissions said (leafMsgAllowed), and
// took it as the worker's; 2.15.3 checks them, so the hub refuses it, as
// any publish outside the leaf's row (docs/design.md §7), and the event
// stays the worker's to settle.
func TestALeafsAcknowledgementsAreChecked(t *testing.T) {
	f := startSiteFleet(t)
	id, err := natsauth.Worker("converge", "hub-y")
	if err != nil {
		t.Fatal(err)
	}
	w := f.connectAs(t, id)
	c, err := w.js.CreateOrUpdateConsumer(ctx(t), events.StreamEvents, jetstream.ConsumerConfig{
		Durable: id.Name(), FilterSubject: "steward.events.release.published", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.hubJS.Publish(ctx(t), "steward.events.release.published", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var reply string
	for m := range batch.Messages() {
		reply = m.Reply()
	}
	if reply == "" {
		t.Fatalf("the worker fetched no event: %v", batch.Error())
	}
	pending := func() int {
		info, err := c.Info(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending
	}
	if n := pending(); n != 1 {
		t.Fatalf("%d events pending acknowledgement, want the one fetched", n)
	}
	l := dialLeaf(t, f.leafAddr, filepath.Join(f.dir, "leaf-site-a.creds"))
	l.send(t, reply, "", nil)
	// Refused is dropped: the refusal is sent once the message was read.
	l.refused(t, reply)
	if n := pending(); n != 1 {
		t.Fatalf("%d events pending acknowledgement after site A's refused acknowledgement, want the worker's one still", n)
	}
}

// TestASiteCatchesUpUnderItsLeafIdentity is a cut under the leaf
// identity: site A's leaf node stops (the link and the site gone at once,
// an outcome just written there), events for it are published at the hub,
// and it starts again on its store. It relinks with its credentials, its
// stream resets the hub's consumer and the hub's sources reset the site's,
// all within the identity's permissions: the site holds every event, the
// hub the site's outcome, and no server logs a violation.
func TestASiteCatchesUpUnderItsLeafIdentity(t *testing.T) {
	f := startSiteFleet(t)
	_, siteA := f.operator(t, f.sites["site-a"], "", "site-a")
	if _, err := siteA.Publish(ctx(t), events.OutcomeSubject("credential", "hive-a1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	f.sites["site-a"].Shutdown()
	f.sites["site-a"].WaitForShutdown()
	workertest.WaitUntil(t, "the hub sees site A gone", func() bool { return f.hub.NumLeafNodes() == 1 })
	const during = 5
	for i := range during {
		if _, err := f.hubJS.Publish(ctx(t), "steward.events.credential.rotated.hive-a1", []byte(`{}`), jetstream.WithMsgID(fmt.Sprintf("cut-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	f.sites["site-a"] = f.start(f.siteOpts["site-a"]())
	workertest.WaitUntil(t, "site A relinks", func() bool { return f.hub.NumLeafNodes() == 2 })
	_, siteA = f.operator(t, f.sites["site-a"], "", "site-a")
	waitCount(t, siteA, events.StreamEvents, during, "site A holds the events published while it was gone")
	waitCount(t, f.hubJS, events.StreamOutcomes, 1, "the hub holds site A's outcome")
	if _, err := siteA.Publish(ctx(t), events.OutcomeSubject("credential", "hive-a1"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	waitCount(t, f.hubJS, events.StreamOutcomes, 2, "the hub holds site A's outcome written after it came back")
	if v := f.log.all(); len(v) != 0 {
		t.Fatalf("the servers refused what a site catching up needs: %q", v)
	}
}
