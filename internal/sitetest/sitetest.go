// Package sitetest starts a hub and a site's leaf node as embedded
// nats-servers, each running JetStream in a domain of its own and linked as
// `steward site config` links them (docs/design.md §9), for the tests of
// sites in events, internal/ops and the commands.
package sitetest

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// HubDomain is the hub's JetStream domain in these tests.
const HubDomain = events.DefaultHubDomain

// Pair is a hub and one site's leaf node.
type Pair struct {
	// Site is the leaf node's name and JetStream domain.
	Site      string
	Hub, Leaf *server.Server

	t        testing.TB
	leafOpts server.Options
}

// Start starts a hub (domain hub, a leaf node port) and site's leaf node
// linked to it, the link denying Steward's subjects both ways, and waits
// until they are linked. Both are shut down when the test ends.
func Start(t testing.TB, site string) *Pair {
	t.Helper()
	leafPort := workertest.FreePort(t)
	p := &Pair{Site: site, t: t}
	p.Hub = start(t, &server.Options{ServerName: "hub", JetStreamDomain: HubDomain, Port: server.RANDOM_PORT, StoreDir: t.TempDir(),
		LeafNode: server.LeafNodeOpts{Host: "127.0.0.1", Port: leafPort}})
	u, err := url.Parse(fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort))
	if err != nil {
		t.Fatal(err)
	}
	deny := events.SiteLinkDenied()
	// The leaf keeps its client port and store across a Restart, as a
	// site's leaf node does across a reboot.
	p.leafOpts = server.Options{ServerName: "steward-site-" + site, JetStreamDomain: site, Port: workertest.FreePort(t), StoreDir: t.TempDir(),
		LeafNode: server.LeafNodeOpts{
			ReconnectInterval: 100 * time.Millisecond,
			Remotes:           []*server.RemoteLeafOpts{{URLs: []*url.URL{u}, DenyImports: deny, DenyExports: deny}},
		}}
	p.Restart()
	return p
}

// Cut shuts the site's leaf node down: from the hub the link is down and
// the site's JetStream answers nothing, as through a cut of the WAN.
func (p *Pair) Cut() {
	p.Leaf.Shutdown()
	p.Leaf.WaitForShutdown()
	workertest.WaitUntil(p.t, "the hub sees the link of "+p.Site+" down", func() bool { return p.Hub.NumLeafNodes() == 0 })
}

// Restart starts the site's leaf node (again, on its port and store) and
// waits until it is linked to the hub.
func (p *Pair) Restart() {
	p.t.Helper()
	o := p.leafOpts
	p.Leaf = start(p.t, &o)
	workertest.WaitUntil(p.t, "the leaf node of "+p.Site+" is linked", func() bool {
		return p.Leaf.NumLeafNodes() == 1 && p.Hub.NumLeafNodes() == 1
	})
}

func start(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	o.Host, o.JetStream, o.NoLog, o.NoSigs = "127.0.0.1", true, true, true
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats server %s not ready in 10s", o.ServerName)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// Connect opens a connection to s, the hub or the site's leaf node, that
// reconnects for as long as the test runs (a cut and a restart come back),
// and its JetStream in domain as a worker there uses it
// (events.JetStreamIn: at the site's own leaf node, the server's own API;
// from the hub, $JS.<site>.API); both close when the test ends.
func Connect(t testing.TB, s *server.Server, domain string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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

// SetupBus sets up Steward's streams and bucket at the hub as `steward
// setup` does, with limits small enough for a test's store, and returns
// the configuration a site's set-up takes.
func SetupBus(ctx context.Context, t testing.TB, hubJS jetstream.JetStream) events.BusConfig {
	t.Helper()
	cfg := events.DefaultBusConfig(1)
	cfg.Streams.MaxBytes, cfg.Streams.DLQMaxBytes, cfg.CheckpointMaxBytes = 64<<20, 16<<20, 16<<20
	if err := events.SetupBus(ctx, hubJS, cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// MakeAsyncSiteEvents makes s's STEWARD_EVENTS at the site (siteJS) as
// set-ups made it for a while, persist_mode async, sourcing the hub's
// consumer for the site, which it makes first: a site set up before its
// events stream was synced, for a test to set up again.
func MakeAsyncSiteEvents(ctx context.Context, t testing.TB, hubJS, siteJS jetstream.JetStream, cfg events.BusConfig, s events.Site) {
	t.Helper()
	if _, err := hubJS.CreateOrUpdatePushConsumer(ctx, events.StreamEvents, events.SiteConsumerConfig(s)); err != nil {
		t.Fatal(err)
	}
	for _, sc := range events.SiteStreamConfigs(cfg.Streams, s) {
		if sc.Name != events.StreamEvents {
			continue
		}
		sc.PersistMode = jetstream.AsyncPersistMode
		if _, err := siteJS.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
}
