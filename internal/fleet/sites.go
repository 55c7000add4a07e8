package fleet

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/leafnode"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
)

// SitesResult is what one run of RunSites measured: hub-to-box latency
// through a leaf node against straight to the hub, in one burst, and one
// site's catch-up after a cut.
type SitesResult struct {
	Sites int
	// PerSite is each site's instances; HubInstances are straight at the
	// hub.
	PerSite      []int
	HubInstances int
	// ServersUp is until the hub and every leaf node answered;
	// AllConsuming until every instance, at the hub and at the sites, was
	// reading, both from RunSites' start.
	ServersUp, AllConsuming time.Duration

	// Burst: one event per instance published at the hub at once. Hub and
	// Leaf are publish-to-settled of the instances straight at the hub and
	// of those behind a leaf node.
	BurstEvents int
	Hub, Leaf   Latency

	// CutSite had its link cut while Queued events for its keys were
	// published at the hub; PendingInCut is what the hub's consumer for the
	// site held for it then.
	CutSite      string
	Queued       int
	PendingInCut uint64
	// Relinked, Stored and CaughtUp are from the heal (the link's proxy
	// listening again): until the hub's consumer for the site was bound
	// again, until every queued event was stored at the site, and until
	// each was settled by its instance.
	Relinked, Stored, CaughtUp time.Duration
	// Results counts the queued events by how their instance settled them
	// (applied, superseded by a newer version of the key, ...); Lost is
	// those never settled.
	Results map[string]int
	Lost    int
	// LeafKilled is when, from the heal, the cut site's leaf node was
	// SIGKILLed and started again (Options.KillLeafAt), zero if it was
	// not; StoredAtKill is how many queued events it had stored then.
	LeafKilled   time.Duration
	StoredAtKill int
	// AppliedTwice and Backwards count, over every instance, an event
	// applied a second time and one applied after a newer version of its
	// hive: both must stay zero.
	AppliedTwice, Backwards int
	// ExtraOutcomes counts the outcomes the cut site stored during the
	// catch-up beyond one an event (ExtraOutcomeExample names one).
	ExtraOutcomes       int
	ExtraOutcomeExample string
	// HubCPU, SiteCPU and BenchCPU are the CPU, in cores, the hub's
	// process, the cut site's leaf node and this process (every instance
	// and the bench) used from the heal until the site caught up.
	HubCPU, SiteCPU, BenchCPU float64
	// SiteWrites are the cut site's writes from the heal until it caught
	// up.
	SiteWrites SiteWrites
	// Samples is the catch-up as it went: the hub's consumer, the site's
	// stream and the instances, every sampleEvery from the heal.
	Samples []CatchUpSample
}

// Latency is publish-to-settled over a group of events.
type Latency struct {
	Events   int
	P50, P99 time.Duration
	// Last is from the first publish until the group's last event settled.
	Last time.Duration
}

// SiteWrites count what a site wrote to its store: events sourced into
// STEWARD_EVENTS, outcomes into STEWARD_OUTCOMES, and every write to its
// checkpoint bucket (checkpoints, cursors, statuses). With sync_interval:
// always each is one fsync.
type SiteWrites struct{ Events, Outcomes, Bucket uint64 }

// PerEvent is the writes per event stored.
func (w SiteWrites) PerEvent() float64 {
	return float64(w.Events+w.Outcomes+w.Bucket) / float64(max(w.Events, 1))
}

// CatchUpSample is one look at a cut site catching up.
type CatchUpSample struct {
	At time.Duration
	// Linked is whether the hub's consumer for the site is bound (the
	// site's source is listening); Pending the events it holds and has not
	// sent, Unconfirmed those sent and not yet confirmed by flow control.
	Linked               bool
	Pending, Unconfirmed uint64
	// Stored is how many of the queued events the site's stream holds;
	// Settled how many its instances have settled.
	Stored, Settled int
}

// Rate is the cut site's catch-up in events a second, from the heal.
func (r SitesResult) Rate() float64 {
	if r.CaughtUp <= 0 {
		return 0
	}
	return float64(r.Queued) / r.CaughtUp.Seconds()
}

// String is the result as the bench prints it.
func (r SitesResult) String() string {
	var b strings.Builder
	total := 0
	for _, n := range r.PerSite {
		total += n
	}
	fmt.Fprintf(&b, "sites                      %d leaf node(s) (%v instances), %d instances straight at the hub, all reading the stream; open bus\n", r.Sites, r.PerSite, r.HubInstances)
	fmt.Fprintf(&b, "servers up                 %v (the hub and %d leaf node(s), each a process)\n", r.ServersUp.Round(time.Millisecond), r.Sites)
	fmt.Fprintf(&b, "all consuming              %v after the bench's start (%d instances)\n", r.AllConsuming.Round(time.Millisecond), total+r.HubInstances)
	fmt.Fprintf(&b, "burst of %d events at hub  publish to settled:\n", r.BurstEvents)
	fmt.Fprintf(&b, "  straight at the hub      %d events: p50 %v, p99 %v, last settled %v after the first publish\n", r.Hub.Events, r.Hub.P50.Round(time.Millisecond), r.Hub.P99.Round(time.Millisecond), r.Hub.Last.Round(time.Millisecond))
	fmt.Fprintf(&b, "  through a leaf node      %d events: p50 %v, p99 %v, last settled %v after the first publish\n", r.Leaf.Events, r.Leaf.P50.Round(time.Millisecond), r.Leaf.P99.Round(time.Millisecond), r.Leaf.Last.Round(time.Millisecond))
	fmt.Fprintf(&b, "cut of %-20s%d events published at the hub during the cut; the hub held %d pending for the site\n", r.CutSite, r.Queued, r.PendingInCut)
	fmt.Fprintf(&b, "after the heal             relinked %v, all stored at the site %v, all settled %v (%.0f events/s)\n",
		r.Relinked.Round(time.Millisecond), r.Stored.Round(time.Millisecond), r.CaughtUp.Round(time.Millisecond), r.Rate())
	if r.LeafKilled > 0 {
		fmt.Fprintf(&b, "leaf node killed           SIGKILLed %v after the heal with %d queued events stored, and started again\n", r.LeafKilled.Round(time.Millisecond), r.StoredAtKill)
		fmt.Fprintf(&b, "CPU during the catch-up    hub %.2f cores, the instances' process %.2f (the leaf's own was split by its restart)\n", r.HubCPU, r.BenchCPU)
	} else {
		fmt.Fprintf(&b, "CPU during the catch-up    hub %.2f cores, %s's leaf node %.2f, the instances' process %.2f\n", r.HubCPU, r.CutSite, r.SiteCPU, r.BenchCPU)
	}
	fmt.Fprintf(&b, "%s's writes            %d events stored, %d outcomes, %d bucket writes: %.1f writes an event\n",
		r.CutSite, r.SiteWrites.Events, r.SiteWrites.Outcomes, r.SiteWrites.Bucket, r.SiteWrites.PerEvent())
	var results []string
	for k, n := range r.Results {
		results = append(results, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(results)
	fmt.Fprintf(&b, "queued events settled      %s; lost %d, applied twice %d, backwards %d\n", strings.Join(results, ", "), r.Lost, r.AppliedTwice, r.Backwards)
	fmt.Fprintf(&b, "outcomes at %-15sone an event and %d more", r.CutSite, r.ExtraOutcomes)
	if r.ExtraOutcomeExample != "" {
		fmt.Fprintf(&b, " (%s)", r.ExtraOutcomeExample)
	}
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "catch-up (from the heal)   %8s %6s %8s %11s %7s %8s\n", "at", "linked", "pending", "unconfirmed", "stored", "settled")
	// At most maxSampleRows rows, the last always among them.
	step := (len(r.Samples) + maxSampleRows - 1) / maxSampleRows
	for i, s := range r.Samples {
		if i%step != 0 && i != len(r.Samples)-1 {
			continue
		}
		fmt.Fprintf(&b, "                           %8v %6v %8d %11d %7d %8d\n", s.At.Round(100*time.Millisecond), s.Linked, s.Pending, s.Unconfirmed, s.Stored, s.Settled)
	}
	return b.String()
}

// siteName is the i-th site's name (from 0), its JetStream domain.
func siteName(i int) string { return "site-" + strconv.Itoa(i+1) }

// siteHive is the j-th hive of site (from 0).
func siteHive(site string, j int) string { return site + "-hive-" + strconv.Itoa(j+1) }

// sampleEvery is how often the catch-up is looked at; maxSampleRows is how
// many of the looks String prints.
const (
	sampleEvery   = 250 * time.Millisecond
	maxSampleRows = 40
)

// settlements are the settled events of a run, by event id, and what the
// instances applied, by hive.
type settlements struct {
	mu sync.Mutex
	at map[string]settled
	// newest is the newest version applied of each hive; twice and
	// backwards count applies of a version at or below it.
	newest           map[string]uint64
	twice, backwards int
}

// applied notes that hive's version was applied.
func (s *settlements) applied(hive string, version uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch newest, ok := s.newest[hive]; {
	case ok && version == newest:
		s.twice++
	case ok && version < newest:
		s.backwards++
	default:
		s.newest[hive] = version
	}
}

type settled struct {
	result string
	at     int64
}

func (s *settlements) record(st workers.Settlement) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[st.Event.ID()]; !ok {
		s.at[st.Event.ID()] = settled{st.Result, st.Settled.UnixNano()}
	}
}

func (s *settlements) of(id string) (settled, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.at[id]
	return st, ok
}

// count is how many of ids are settled.
func (s *settlements) count(ids []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if _, ok := s.at[id]; ok {
			n++
		}
	}
	return n
}

// RunSites measures a fleet across sites (docs/design.md §9): a hub
// (JetStream domain hub, a leaf node port) and o.Sites leaf nodes, each a
// site in a domain of its own configured as `steward site config` writes
// it and linked through a LinkProxy, each in a process of its own; the
// hub's streams set up as `steward setup` does and each site's as
// `steward site setup` does. o.Instances stream-reading credential
// instances are split over the sites, each connected to its site's leaf
// node in the site's domain as a worker there is, and as many again run
// straight at the hub. It publishes one signed rotation per instance at
// the hub and compares publish-to-settled through a leaf with straight at
// the hub; then it cuts the first site's link, publishes o.Queued
// rotations for its hives at the hub, heals the link, and times the site's
// catch-up until every one of them is settled.
func RunSites(ctx context.Context, o Options) (SitesResult, error) {
	o = o.withDefaults()
	res := SitesResult{Sites: o.Sites, HubInstances: o.Instances, Queued: o.Queued, Results: map[string]int{}}
	if o.Sites < 1 {
		return res, errors.New("--sites: want at least 1")
	}
	if o.Cluster {
		return res, errors.New("--cluster with --sites: the sites' hub is one server; run the cluster without --sites")
	}
	if o.Instances < o.Sites {
		return res, fmt.Errorf("--instances %d: want at least one a site (--sites %d)", o.Instances, o.Sites)
	}
	dir, err := os.MkdirTemp("", "steward-fleet-sites-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	command := o.ServerCommand
	if o.ServerBin != "" {
		command = []string{o.ServerBin}
	}
	start := time.Now()

	// The hub: JetStream in domain hub, listening for leaf nodes.
	o.Progress("starting the hub and %d leaf node(s)", o.Sites)
	hubPort, err := freePort()
	if err != nil {
		return res, err
	}
	leafPort, err := freePort()
	if err != nil {
		return res, err
	}
	// sync_interval: always as deploy/nats.conf runs a hub, and as the leaf
	// configuration writes it: the two sides write alike, so the burst
	// compares the leaf's hop, not two disks' settings.
	hubConf := fmt.Sprintf("server_name: hub\nlisten: 127.0.0.1:%d\njetstream {\n  domain: %s\n  store_dir: %q\n  sync_interval: always\n}\nleafnodes {\n  listen: \"127.0.0.1:%d\"\n}\n",
		hubPort, events.DefaultHubDomain, filepath.Join(dir, "hub"), leafPort)
	hub, err := startNode(command, dir, "hub", hubPort, []byte(hubConf))
	if err != nil {
		return res, err
	}
	defer hub.Kill()

	// The sites, each linked through a proxy the bench can cut.
	nodes := []*Node{hub}
	proxies := make([]*LinkProxy, o.Sites)
	leaves := make([]*Node, o.Sites)
	for i := range o.Sites {
		if proxies[i], err = StartLinkProxy(fmt.Sprintf("127.0.0.1:%d", leafPort)); err != nil {
			return res, err
		}
		defer proxies[i].Cut()
		port, err := freePort()
		if err != nil {
			return res, err
		}
		c := leafnode.Config{
			Site: siteName(i), HubURL: "nats-leaf://" + proxies[i].Addr(),
			Listen: fmt.Sprintf("127.0.0.1:%d", port), Store: filepath.Join(dir, siteName(i)),
		}
		if err := c.Check(); err != nil {
			return res, err
		}
		if leaves[i], err = startNode(command, dir, siteName(i), port, c.Render()); err != nil {
			return res, err
		}
		defer leaves[i].Kill()
		nodes = append(nodes, leaves[i])
	}
	for _, n := range nodes {
		if err := n.WaitJetStream(ctx, 60*time.Second); err != nil {
			return res, err
		}
	}
	res.ServersUp = time.Since(start)

	hubJSs, err := connectAll(hub.URL(), o.Conns, "")
	if err != nil {
		return res, err
	}
	defer closeAll(hubJSs)
	hubJS := hubJSs[0]
	// The operator's set-up: the hub's streams as `steward setup` makes
	// them, then each site's as `steward site setup` does, from the hub,
	// once its leaf node is linked (retried until then).
	cfg := events.DefaultBusConfig(1)
	if err := retry(ctx, o.Timeout, func() error { return events.SetupBus(ctx, hubJS, cfg) }); err != nil {
		return res, fmt.Errorf("setup at the hub: %w", err)
	}
	hives := make([][]string, o.Sites)
	for j := range o.Instances {
		i := j % o.Sites
		hives[i] = append(hives[i], siteHive(siteName(i), len(hives[i])))
	}
	for i := range o.Sites {
		res.PerSite = append(res.PerSite, len(hives[i]))
		site := events.Site{Name: siteName(i), HubDomain: events.DefaultHubDomain, Hives: hives[i]}
		siteJS, err := events.JetStreamIn(hubJS.Conn(), site.Name)
		if err != nil {
			return res, err
		}
		if err := retry(ctx, o.Timeout, func() error {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return events.SetupSite(sctx, siteJS, hubJS, cfg, site)
		}); err != nil {
			return res, fmt.Errorf("site set-up of %s: %w", site.Name, err)
		}
	}

	// The controller's key signs every rotation; each instance ranks and
	// applies only what it verifies, as the credential worker does.
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return res, err
	}
	keys, err := signing.NewKeySet(pub)
	if err != nil {
		return res, err
	}
	rank := func(_ context.Context, d *workers.Delivery) (uint64, error) {
		var data events.CredentialRotated
		if err := d.DataAs(&data); err != nil {
			return 0, err
		}
		r, err := signing.OpenRotation(keys, data)
		if err != nil {
			return 0, fmt.Errorf("rotation %s ranks nowhere: %w", d.Event.ID(), err)
		}
		return r.Version, nil
	}
	book := &settlements{at: map[string]settled{}, newest: map[string]uint64{}}
	reg := prometheus.NewRegistry()
	newInstance := func(js jetstream.JetStream, hive, domain string) (*workers.Runtime, error) {
		spec := workers.Spec{
			Name: "credential", Instance: hive,
			Subjects: []string{events.EventsPrefix + ".credential.rotated." + hive},
			Types:    []string{events.TypeCredentialRotated},
			Rank:     rank,
		}
		opts := []workers.Option{workers.WithRegisterer(reg), workers.WithReadMode(workers.ReadStream), workers.WithSettledHook(book.record)}
		if domain != "" {
			opts = append(opts, workers.WithDomain(domain))
		}
		return workers.New(js, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
			version, err := rank(ctx, d)
			if err != nil {
				return workers.Refused(err)
			}
			book.applied(d.Key, version)
			return d.Emit(ctx, "applied", map[string]any{"hive": d.Key})
		}), opts...)
	}

	// The instances: straight at the hub as bench fleet runs them, and at
	// each site on connections to its own leaf node in its domain, as
	// `steward worker --js-domain <site>` connects.
	o.Progress("starting %d instances at the hub and %d at %d site(s)", o.Instances, o.Instances, o.Sites)
	atHub, err := startInstances(ctx, o, o.Instances, func(j int) (*workers.Runtime, error) {
		return newInstance(hubJSs[j%len(hubJSs)], Instance(j), "")
	})
	defer atHub.stop()
	if err != nil {
		return res, fmt.Errorf("at the hub: %w", err)
	}
	siteJSs := make([][]jetstream.JetStream, o.Sites)
	for i := range o.Sites {
		if siteJSs[i], err = connectAll(leaves[i].URL(), max(2, o.Conns/o.Sites), siteName(i)); err != nil {
			return res, err
		}
		defer closeAll(siteJSs[i])
		atSite, err := startInstances(ctx, o, len(hives[i]), func(j int) (*workers.Runtime, error) {
			return newInstance(siteJSs[i][j%len(siteJSs[i])], hives[i][j], siteName(i))
		})
		defer atSite.stop()
		if err != nil {
			return res, fmt.Errorf("at %s: %w", siteName(i), err)
		}
	}
	res.AllConsuming = time.Since(start)
	o.Progress("all %d instances consuming after %v; a burst of one event each", 2*o.Instances, res.AllConsuming.Round(time.Millisecond))

	if err := sitesBurst(ctx, o, hubJSs, priv, hives, book, &res); err != nil {
		return res, err
	}
	cpu := []func() (time.Duration, error){hub.CPU, leaves[0].CPU, func() (time.Duration, error) { return processCPU(os.Getpid()) }}
	err = catchUp(ctx, o, hubJSs, siteJSs[0][0], proxies[0], leaves[0], cpu, priv, hives[0], book, &res)
	book.mu.Lock()
	res.AppliedTwice, res.Backwards = book.twice, book.backwards
	book.mu.Unlock()
	return res, err
}

// sitesBurst publishes version 1 of every hive, at the hub and at the
// sites, at once at the hub, and waits until each is settled.
func sitesBurst(ctx context.Context, o Options, hubJSs []jetstream.JetStream, key ed25519.PrivateKey, hives [][]string, book *settlements, res *SitesResult) error {
	var all []string
	for j := range o.Instances {
		all = append(all, Instance(j))
	}
	// Interleaved, so neither group is published first.
	for j := 0; ; j++ {
		more := false
		for _, list := range hives {
			if j < len(list) {
				all, more = append(all, list[j]), true
			}
		}
		if !more {
			break
		}
	}
	slices.SortStableFunc(all, func(a, b string) int { return hiveIndex(a) - hiveIndex(b) })
	msgs := make([]*nats.Msg, len(all))
	ids := make([]string, len(all))
	for k, hive := range all {
		var err error
		if msgs[k], err = rotation(hive, 1, key); err != nil {
			return err
		}
		ids[k] = rotationID(hive, 1)
	}
	bctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	begin := time.Now().UnixNano()
	publishedAt, err := publish(bctx, hubJSs, msgs)
	if err != nil {
		return fmt.Errorf("publish the burst: %w", err)
	}
	if err := waitUntil(bctx, func() (bool, string) {
		n := book.count(ids)
		return n == len(ids), fmt.Sprintf("%d of %d settled", n, len(ids))
	}); err != nil {
		return err
	}
	var hub, leaf []time.Duration
	var hubLast, leafLast int64
	for k, id := range ids {
		st, _ := book.of(id)
		if isSiteHive(all[k]) {
			leaf, leafLast = append(leaf, time.Duration(st.at-publishedAt[k])), max(leafLast, st.at)
		} else {
			hub, hubLast = append(hub, time.Duration(st.at-publishedAt[k])), max(hubLast, st.at)
		}
	}
	res.BurstEvents = len(ids)
	res.Hub = latencyOf(hub, time.Duration(hubLast-begin))
	res.Leaf = latencyOf(leaf, time.Duration(leafLast-begin))
	return nil
}

// hiveIndex is the number a hive's name ends in, so a hub's and a site's
// hives of one number are published side by side.
func hiveIndex(hive string) int {
	n, _ := strconv.Atoi(hive[strings.LastIndexByte(hive, '-')+1:])
	return n
}

func isSiteHive(hive string) bool { return strings.HasPrefix(hive, "site-") }

func latencyOf(lat []time.Duration, last time.Duration) Latency {
	slices.Sort(lat)
	return Latency{Events: len(lat), P50: percentile(lat, 50), P99: percentile(lat, 99), Last: last}
}

// catchUp cuts site's link (proxy), publishes o.Queued rotations for its
// hives at the hub (versions 2 on, round-robin over the hives), heals the
// link and follows the site until each is settled, reading the CPU of the
// hub, the site and this process (cpu, in that order) over it; with
// o.KillLeafAt it SIGKILLs the site's leaf node on the way and starts it
// again.
func catchUp(ctx context.Context, o Options, hubJSs []jetstream.JetStream, siteJS jetstream.JetStream, proxy *LinkProxy, leaf *Node, cpu []func() (time.Duration, error), key ed25519.PrivateKey, hives []string, book *settlements, res *SitesResult) error {
	site := siteName(0)
	res.CutSite = site
	hubJS := hubJSs[0]
	consumer, err := hubJS.PushConsumer(ctx, events.StreamEvents, events.SiteConsumer(site))
	if err != nil {
		return fmt.Errorf("the hub's consumer for %s: %w", site, err)
	}
	look := func() (*jetstream.ConsumerInfo, error) {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return consumer.Info(lctx)
	}
	// The site's writes: events stored, outcomes written, and every write
	// to its bucket (checkpoints, cursors, statuses), each a stream's last
	// sequence.
	written := func(stream string) func() (uint64, error) {
		return func() (uint64, error) {
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			st, err := siteJS.Stream(lctx, stream)
			if err != nil {
				return 0, fmt.Errorf("%s's %s: %w", site, stream, err)
			}
			return st.CachedInfo().State.LastSeq, nil
		}
	}
	stored, outcomes, bucket := written(events.StreamEvents), written(events.StreamOutcomes), written("KV_"+events.CheckpointBucket)
	var before [3]uint64
	for i, count := range []func() (uint64, error){stored, outcomes, bucket} {
		if before[i], err = count(); err != nil {
			return err
		}
	}

	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	o.Progress("cutting %s's link", site)
	proxy.Cut()
	if err := waitUntil(wctx, func() (bool, string) {
		info, err := look()
		if err != nil {
			return false, err.Error()
		}
		return !info.PushBound, "the hub's consumer for " + site + " is still bound"
	}); err != nil {
		return fmt.Errorf("the cut: %w", err)
	}

	o.Progress("publishing %d events for %s's %d hives at the hub", o.Queued, site, len(hives))
	msgs := make([]*nats.Msg, o.Queued)
	ids := make([]string, o.Queued)
	for k := range msgs {
		hive, v := hives[k%len(hives)], uint64(2+k/len(hives))
		if msgs[k], err = rotation(hive, v, key); err != nil {
			return err
		}
		ids[k] = rotationID(hive, v)
	}
	if _, err := publish(wctx, hubJSs, msgs); err != nil {
		return fmt.Errorf("publish during the cut: %w", err)
	}
	if err := waitUntil(wctx, func() (bool, string) {
		info, err := look()
		if err != nil {
			return false, err.Error()
		}
		res.PendingInCut = info.NumPending
		return info.NumPending >= uint64(o.Queued), fmt.Sprintf("the hub holds %d of %d for %s", info.NumPending, o.Queued, site)
	}); err != nil {
		return fmt.Errorf("during the cut: %w", err)
	}
	if n := book.count(ids); n != 0 {
		return fmt.Errorf("%d events published during the cut were settled at %s before the heal: the cut let them through", n, site)
	}

	o.Progress("healing %s's link", site)
	if err := proxy.Heal(); err != nil {
		return err
	}
	cpuAtHeal := make([]time.Duration, len(cpu))
	for i, c := range cpu {
		if cpuAtHeal[i], err = c(); err != nil {
			return err
		}
	}
	healed := time.Now()
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	for {
		s := CatchUpSample{At: time.Since(healed), Settled: book.count(ids)}
		if info, err := look(); err == nil {
			s.Linked, s.Pending, s.Unconfirmed = info.PushBound, info.NumPending, uint64(info.NumAckPending)
		}
		if n, err := stored(); err == nil {
			s.Stored = int(n - before[0])
		}
		res.Samples = append(res.Samples, s)
		if s.Linked && res.Relinked == 0 {
			res.Relinked = s.At
		}
		if s.Stored >= o.Queued && res.Stored == 0 {
			res.Stored = s.At
		}
		if o.KillLeafAt > 0 && res.LeafKilled == 0 && s.Stored >= o.KillLeafAt {
			o.Progress("SIGKILLing %s's leaf node with %d queued events stored, and starting it again", site, s.Stored)
			leaf.Kill()
			if err := leaf.Start(); err != nil {
				return fmt.Errorf("start %s's leaf node again: %w", site, err)
			}
			res.LeafKilled, res.StoredAtKill = time.Since(healed), s.Stored
		}
		if s.Settled == o.Queued {
			break
		}
		select {
		case <-wctx.Done():
			res.Lost = o.Queued - s.Settled
			return fmt.Errorf("%s caught up on %d of %d events in %v after the heal: %w", site, s.Settled, o.Queued, o.Timeout, wctx.Err())
		case <-tick.C:
		}
	}
	cores := make([]float64, len(cpu))
	for i, c := range cpu {
		now, err := c()
		if err != nil {
			return err
		}
		cores[i] = (now - cpuAtHeal[i]).Seconds() / time.Since(healed).Seconds()
	}
	res.HubCPU, res.SiteCPU, res.BenchCPU = cores[0], cores[1], cores[2]
	var after [3]uint64
	for i, count := range []func() (uint64, error){stored, outcomes, bucket} {
		if after[i], err = count(); err != nil {
			return err
		}
	}
	res.SiteWrites = SiteWrites{Events: after[0] - before[0], Outcomes: after[1] - before[1], Bucket: after[2] - before[2]}
	if res.ExtraOutcomes, res.ExtraOutcomeExample, err = extraOutcomes(wctx, siteJS, before[1]+1, after[1]); err != nil {
		return fmt.Errorf("read %s's outcomes: %w", site, err)
	}
	// The last settlement's own time, not the sample's.
	var last int64
	for _, id := range ids {
		st, _ := book.of(id)
		res.Results[st.result]++
		last = max(last, st.at)
	}
	res.CaughtUp = time.Duration(last - healed.UnixNano())
	if res.Relinked == 0 {
		res.Relinked = res.CaughtUp
	}
	if res.Stored == 0 {
		res.Stored = res.CaughtUp
	}
	return nil
}

// extraOutcomes reads the outcomes stored at sequences first to last of
// siteJS's STEWARD_OUTCOMES and counts those beyond the first of each
// event (by causation id), naming one.
func extraOutcomes(ctx context.Context, siteJS jetstream.JetStream, first, last uint64) (int, string, error) {
	if last < first {
		return 0, "", nil
	}
	c, err := siteJS.OrderedConsumer(ctx, events.StreamOutcomes, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first, InactiveThreshold: 5 * time.Second,
	})
	if err != nil {
		return 0, "", err
	}
	seen := map[string]string{}
	extra, example := 0, ""
	for {
		batch, err := c.FetchNoWait(1000)
		if err != nil {
			return 0, "", err
		}
		var seq uint64
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				return 0, "", err
			}
			seq = meta.Sequence.Stream
			if seq > last {
				break
			}
			e, err := events.Decode(m.Headers(), m.Data())
			if err != nil {
				return 0, "", fmt.Errorf("outcome at %d: %w", seq, err)
			}
			cause, _ := e.Extensions()["causationid"].(string)
			if was, ok := seen[cause]; ok {
				extra++
				example = fmt.Sprintf("%s: %s, then %s (%s)", cause, was, e.ID(), e.Type())
				continue
			}
			seen[cause] = e.ID()
		}
		if batch.Error() != nil {
			return 0, "", batch.Error()
		}
		if n == 0 || seq >= last {
			return extra, example, nil
		}
	}
}

// connectAll opens n connections to url, each with the JetStream of
// domain as a worker there uses it (events.JetStreamIn; empty: the
// server's own).
func connectAll(url string, n int, domain string) ([]jetstream.JetStream, error) {
	jss := make([]jetstream.JetStream, 0, n)
	for range n {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.Name("steward bench fleet"))
		if err != nil {
			closeAll(jss)
			return nil, err
		}
		js, err := events.JetStreamIn(nc, domain)
		if err != nil {
			nc.Close()
			closeAll(jss)
			return nil, err
		}
		jss = append(jss, js)
	}
	return jss, nil
}

func closeAll(jss []jetstream.JetStream) {
	for _, js := range jss {
		js.Conn().Close()
	}
}
