package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/fleet"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// fleetLedger is the world the instances change: per instance, the
// version in place, as a real worker keeps it (a version not above the one
// in place is not applied again, as credential's files and provision's
// recorded generation refuse it). It records every version applied, and
// counts the handovers of a version already in place (a delivery whose
// settling failed and was tried again), which change nothing.
type fleetLedger struct {
	mu        sync.Mutex
	applied   map[string][]uint64 // instance -> versions, in the order applied
	at        map[string]time.Time
	handovers int
}

func (l *fleetLedger) apply(instance string, v uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.applied[instance]
	if len(a) > 0 && v <= a[len(a)-1] {
		l.handovers++
		return
	}
	l.applied[instance] = append(a, v)
	if v == 1 {
		l.at[instance] = time.Now()
	}
}

func (l *fleetLedger) last(instance string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.applied[instance]
	if len(a) == 0 {
		return 0
	}
	return a[len(a)-1]
}

// TestFleetOnAClusterSurvivesANodeRestart is the fleet fault. Invariant:
// on a three-node cluster with the streams and the bucket at three
// replicas, 3,000 host-bound instances reading the stream (no consumer
// each) handle a burst of one event per instance; then a node that is not
// the events stream's leader is killed with SIGKILL while more rounds of
// events flow, and started again. Every instance keeps or regains its
// work: every acknowledged event is applied exactly once, in order per
// instance (0 lost, 0 applied twice, 0 keys backwards), within a bound.
func TestFleetOnAClusterSurvivesANodeRestart(t *testing.T) {
	const (
		instances = 3000
		rounds    = 4 // round 1 is the burst; the kill lands in round 2
	)
	rng := rand.New(rand.NewPCG(seed(t), 11))
	c := startCluster(t, "steward-fleet", 3)
	b := connect(t, c.urls())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	waitFor(t, "the streams and bucket are set up at three replicas", 2*time.Minute, func() (bool, string) {
		// Each attempt is bounded: a request sent before the cluster
		// has a meta leader is never answered.
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		defer acancel()
		err := events.SetupBus(actx, b.js, events.DefaultBusConfig(3))
		return err == nil, fmt.Sprint(err)
	})

	// Instances share a few connections, each to all three nodes.
	var conns []jetstream.JetStream
	for range 6 {
		nc, err := nats.Connect(c.urls(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, js)
	}
	ledger := &fleetLedger{applied: map[string][]uint64{}, at: map[string]time.Time{}}
	reg := prometheus.NewRegistry()
	runCtx, stopAll := context.WithCancel(context.Background())
	var running sync.WaitGroup
	t.Cleanup(func() { stopAll(); running.Wait() })
	start := time.Now()
	var started atomic.Int64
	sem := make(chan struct{}, 64)
	for i := range instances {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			var w *workers.Runtime
			waitFor(t, "instance "+fleet.Instance(i)+" starts", 2*time.Minute, func() (bool, string) {
				var err error
				w, err = workers.New(conns[i%len(conns)], fleet.Spec(i), workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
					var data events.CredentialRotated
					if err := d.DataAs(&data); err != nil {
						return err
					}
					ledger.apply(d.Key, data.Version)
					return nil
				}), workers.WithRegisterer(reg), workers.WithReadMode(workers.ReadStream),
					// A wake-up lost with a dying node is covered by the
					// reconnect's read; the resync is the last resort, short
					// here to bound the test.
					workertest.ResyncEvery(20*time.Second))
				return err == nil, fmt.Sprint(err)
			})
			running.Add(1)
			go func() { defer running.Done(); _ = w.Run(runCtx) }()
			waitFor(t, "instance "+fleet.Instance(i)+" is reading", time.Minute, func() (bool, string) { return w.Ready() == nil, "" })
			started.Add(1)
		}()
	}
	waitFor(t, "every instance is reading", 2*time.Minute, func() (bool, string) {
		return started.Load() == instances, fmt.Sprintf("%d of %d", started.Load(), instances)
	})
	allReading := time.Since(start)

	// publishRound publishes version v for every instance, each retried
	// until the cluster acknowledges it (its id makes a retry a duplicate).
	var acked atomic.Int64
	var sentMu sync.Mutex
	sent := map[string]time.Time{}
	publishRound := func(v uint64) {
		var wg sync.WaitGroup
		for part := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := part; i < instances; i += 8 {
					hive := fleet.Instance(i)
					e := event.New()
					e.SetID(fmt.Sprintf("fleet-%s-%d", hive, v))
					e.SetType(events.TypeCredentialRotated)
					e.SetSource("/steward/e2e")
					e.SetSubject(hive)
					e.SetTime(time.Now())
					_ = e.SetData(events.ContentTypeJSON, events.CredentialRotated{Hive: hive, Version: v, ClientID: "c", Secret: rotationSecret})
					for {
						pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
						at := time.Now()
						_, err := b.pub.Publish(pctx, e)
						pcancel()
						if err == nil {
							acked.Add(1)
							if v == 1 {
								sentMu.Lock()
								sent[hive] = at
								sentMu.Unlock()
							}
							break
						}
						if ctx.Err() != nil {
							return
						}
					}
				}
			}()
		}
		wg.Wait()
	}
	settledRound := func(v uint64) (bool, string) {
		n := 0
		for i := range instances {
			if ledger.last(fleet.Instance(i)) >= v {
				n++
			}
		}
		return n == instances, fmt.Sprintf("%d of %d instances at version %d", n, instances, v)
	}

	burstStart := time.Now()
	publishRound(1)
	waitFor(t, "the burst is handled everywhere", 2*time.Minute, func() (bool, string) { return settledRound(1) })
	burst := time.Since(burstStart)
	var lat durations
	ledger.mu.Lock()
	for hive, at := range ledger.at {
		lat = append(lat, at.Sub(sent[hive]))
	}
	ledger.mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	// The latencies are figures for the summary, not a pass mark: speed is
	// `steward bench fleet`'s to measure, and on two shared cores running
	// the rest of the suite beside this one the p99 reached 7.8s.
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]

	ci, err := streamCluster(b, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	var victim *natsNode
	for _, n := range c.nodes {
		if n.name != ci.Leader && (victim == nil || rng.IntN(2) == 0) {
			victim = n
		}
	}
	outageStart := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); publishRound(2) }()
	victim.p.kill()
	<-done
	publishRound(3)
	victim.start(t)
	outage := time.Since(outageStart)
	publishRound(4)
	recovered := waitFor(t, "every instance has applied every round", 3*time.Minute, func() (bool, string) { return settledRound(rounds) })

	lost, dup, backwards := 0, 0, 0
	ledger.mu.Lock()
	for i := range instances {
		a := ledger.applied[fleet.Instance(i)]
		seen := map[uint64]int{}
		for j, v := range a {
			seen[v]++
			if j > 0 && v < a[j-1] {
				backwards++
			}
		}
		for v := uint64(1); v <= rounds; v++ {
			switch seen[v] {
			case 0:
				lost++
			case 1:
			default:
				dup += seen[v] - 1
			}
		}
	}
	ledger.mu.Unlock()
	if lost+dup+backwards != 0 || acked.Load() != instances*rounds {
		t.Errorf("acknowledged %d of %d; lost %d, applied twice %d, backwards %d; want all acknowledged and 0, 0, 0", acked.Load(), instances*rounds, lost, dup, backwards)
	}
	summary(t, "fleet-cluster-node-restart",
		"instances", instances, "nodes", 3, "replicas", 3, "read_mode", "stream", "killed", victim.name,
		"all_reading", round(allReading), "burst_all_handled", round(burst), "burst_p50", round(p50), "burst_p99", round(p99),
		"events", instances*rounds, "lost", lost, "duplicates_applied", dup, "backwards", backwards, "handovers_of_applied", ledger.handovers,
		"outage", round(outage), "settled_after_restart", round(recovered))
}
