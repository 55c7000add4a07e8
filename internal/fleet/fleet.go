// Package fleet measures what a fleet of host-bound worker instances costs
// the NATS server: N instances of the credential worker's Spec run by the
// runtime in one process, exactly as `steward worker` runs them (workers.New
// then Run, default options), against nats-server in its own process (or a
// three-node cluster of them), so the server's memory and CPU are its own.
// `steward bench fleet` prints its Result; the goals the issue sets are
// held there, never in timed unit tests.
package fleet

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
)

// Options say what to measure.
type Options struct {
	// Instances is how many worker instances run (hive-1 ... hive-N).
	Instances int
	// Cluster runs three servers with R3 streams and bucket instead of one.
	Cluster bool
	// Conns is how many NATS connections the instances share (real hosts
	// each have their own). Zero: one per 500 instances, at least 2.
	Conns int
	// Parallel is how many instances start at once. Zero: 64.
	Parallel int
	// Idle is how long idle CPU is measured. Zero: 10s.
	Idle time.Duration
	// Timeout bounds each phase. Zero: 5 minutes.
	Timeout time.Duration
	// ServerBin is a nats-server binary to run; empty runs ServerCommand.
	ServerBin string
	// ServerCommand runs the embedded nats-server (RunServer) in a process
	// of its own, given "-c <config>" after it: the bench's binary started
	// again with its hidden command (steward bench fleet-server).
	ServerCommand []string
	// ReadMode is how the instances read their events (the runtime's
	// WithReadMode): through a consumer each, or from the stream.
	ReadMode workers.ReadMode
	// Sites is how many sites RunSites splits the instances over, each
	// behind a leaf node of its own (at least one); Run ignores it.
	Sites int
	// Queued is how many events RunSites publishes for the site it cuts.
	// Zero: 10,000.
	Queued int
	// KillLeafAt, when positive, has RunSites SIGKILL the cut site's leaf
	// node once that many of the queued events are stored there, during
	// the catch-up, and start it again at once: what a leaf that dies
	// before it has flushed the events it sourced does to the catch-up.
	KillLeafAt int
	// Progress, when set, is told what the bench is doing.
	Progress func(format string, args ...any)
}

// Result is what one run measured. Times are from the moment Run started
// the instances (after the servers were up) unless said otherwise.
type Result struct {
	Instances int
	ReadMode  workers.ReadMode
	Nodes     int
	Conns     int
	// ServersUp is how long the servers took to start and form.
	ServersUp time.Duration
	// AllConsuming is from the bench's start (the servers' start included)
	// until every instance was consuming.
	AllConsuming time.Duration
	// Starting is from the first instance's start until the last was
	// consuming.
	Starting time.Duration
	// BaseRSS and RSS are each node's resident memory before the instances
	// started and once they were all consuming and idle.
	BaseRSS, RSS []int64
	// IdleCPU is each node's CPU, in cores, over the idle window.
	IdleCPU []float64
	Idle    time.Duration
	// Burst is from the first publish of one event per instance until the
	// last was settled; P50 and P99 are of publish-to-settled per event.
	Burst    time.Duration
	P50, P99 time.Duration
	Settled  int
}

// PerInstance is the servers' resident memory over the instances, all of
// it and the growth over the servers' own baseline.
func (r Result) PerInstance() (total, growth float64) {
	var rss, base int64
	for i := range r.RSS {
		rss += r.RSS[i]
		base += r.BaseRSS[i]
	}
	n := float64(max(r.Instances, 1))
	return float64(rss) / n, float64(rss-base) / n
}

// String is the result as the bench prints it.
func (r Result) String() string {
	var b strings.Builder
	total, growth := r.PerInstance()
	fmt.Fprintf(&b, "instances                  %d on %d server process(es), %d shared connections, reading by %s\n", r.Instances, r.Nodes, r.Conns, r.ReadMode)
	fmt.Fprintf(&b, "servers up                 %v\n", r.ServersUp.Round(time.Millisecond))
	fmt.Fprintf(&b, "all consuming              %v after the bench's start (%v from the first instance's start)\n", r.AllConsuming.Round(time.Millisecond), r.Starting.Round(time.Millisecond))
	for i := range r.RSS {
		fmt.Fprintf(&b, "server n%d memory           %.1f MiB (%.1f MiB before the instances)\n", i+1, float64(r.RSS[i])/(1<<20), float64(r.BaseRSS[i])/(1<<20))
	}
	fmt.Fprintf(&b, "server memory per instance %.1f KiB (%.1f KiB over the servers' baseline), all servers together\n", total/1024, growth/1024)
	for i, c := range r.IdleCPU {
		fmt.Fprintf(&b, "server n%d idle CPU         %.4f cores over %v\n", i+1, c, r.Idle)
	}
	fmt.Fprintf(&b, "burst of %d events          all settled in %v; publish to settled p50 %v, p99 %v\n", r.Settled, r.Burst.Round(time.Millisecond), r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond))
	return b.String()
}

func (o Options) withDefaults() Options {
	if o.Conns <= 0 {
		o.Conns = max(2, o.Instances/500)
	}
	if o.Parallel <= 0 {
		o.Parallel = 64
	}
	if o.Idle <= 0 {
		o.Idle = 10 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Queued <= 0 {
		o.Queued = 10_000
	}
	if o.Progress == nil {
		o.Progress = func(string, ...any) {}
	}
	return o
}

// Instance returns the name of the i-th instance (from 0).
func Instance(i int) string { return "hive-" + strconv.Itoa(i+1) }

// Spec is the i-th instance's Spec: the credential worker's, for its hive.
func Spec(i int) workers.Spec {
	hive := Instance(i)
	return workers.Spec{
		Name: "credential", Instance: hive,
		Subjects: []string{events.EventsPrefix + ".credential.rotated." + hive},
		Types:    []string{events.TypeCredentialRotated},
	}
}

// Run starts nats-server in processes of their own, starts the instances,
// measures them idle, publishes one event per instance and waits until each
// is settled.
func Run(ctx context.Context, o Options) (Result, error) {
	o = o.withDefaults()
	if o.Instances < 1 {
		return Result{}, errors.New("--instances: want at least 1")
	}
	dir, err := os.MkdirTemp("", "steward-fleet-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	command := o.ServerCommand
	if o.ServerBin != "" {
		command = []string{o.ServerBin}
	}

	res := Result{Instances: o.Instances, Conns: o.Conns, Idle: o.Idle, ReadMode: o.ReadMode}
	start := time.Now()
	nodes, replicas := 1, 1
	if o.Cluster {
		nodes, replicas = 3, 3
	}
	o.Progress("starting %d nats-server process(es)", nodes)
	srv, err := StartServers(ctx, command, dir, nodes)
	if err != nil {
		return res, err
	}
	defer srv.Close()
	res.Nodes = nodes
	res.ServersUp = time.Since(start)

	conns := make([]*nats.Conn, o.Conns)
	jss := make([]jetstream.JetStream, o.Conns)
	for i := range conns {
		if conns[i], err = nats.Connect(srv.URLs(), nats.MaxReconnects(-1), nats.Name("steward bench fleet")); err != nil {
			return res, err
		}
		defer conns[i].Close()
		if jss[i], err = jetstream.New(conns[i]); err != nil {
			return res, err
		}
	}
	// The operator's set-up, as `steward setup` does it, with room for the
	// fleet: the bench's instances and a few tools.
	cfg := events.DefaultBusConfig(replicas)
	cfg.Streams.MaxConsumers = max(cfg.Streams.MaxConsumers, o.Instances+100)
	if err := retry(ctx, o.Timeout, func() error { return events.SetupBus(ctx, jss[0], cfg) }); err != nil {
		return res, fmt.Errorf("setup: %w", err)
	}
	for _, n := range srv.Nodes {
		rss, err := n.RSS()
		if err != nil {
			return res, err
		}
		res.BaseRSS = append(res.BaseRSS, rss)
	}

	o.Progress("starting %d instances", o.Instances)
	settledAt := make([]atomic.Int64, o.Instances)
	reg := prometheus.NewRegistry()
	startAt := time.Now()
	fl, err := startInstances(ctx, o, o.Instances, func(i int) (*workers.Runtime, error) {
		return workers.New(jss[i%len(jss)], Spec(i), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
			return d.Emit(ctx, "applied", map[string]any{"hive": d.Key})
		}), workers.WithRegisterer(reg), workers.WithReadMode(o.ReadMode), workers.WithSettledHook(func(s workers.Settlement) {
			settledAt[i].CompareAndSwap(0, s.Settled.UnixNano())
		}))
	})
	defer fl.stop()
	if err != nil {
		return res, err
	}
	res.Starting = time.Since(startAt)
	res.AllConsuming = time.Since(start)
	o.Progress("all %d consuming after %v; measuring the idle servers for %v", o.Instances, res.AllConsuming.Round(time.Millisecond), o.Idle)

	// Let the start settle (the last pull requests, the consumers' first
	// state writes), then measure an idle window.
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	before := make([]time.Duration, len(srv.Nodes))
	for i, n := range srv.Nodes {
		if before[i], err = n.CPU(); err != nil {
			return res, err
		}
	}
	t0 := time.Now()
	select {
	case <-time.After(o.Idle):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	elapsed := time.Since(t0)
	for i, n := range srv.Nodes {
		after, err := n.CPU()
		if err != nil {
			return res, err
		}
		res.IdleCPU = append(res.IdleCPU, (after-before[i]).Seconds()/elapsed.Seconds())
		rss, err := n.RSS()
		if err != nil {
			return res, err
		}
		res.RSS = append(res.RSS, rss)
	}

	o.Progress("publishing one event per instance")
	if err := burst(ctx, o, jss, settledAt, &res); err != nil {
		return res, err
	}
	return res, nil
}

// burst publishes one credential rotation per instance at once and waits
// until every one is settled.
func burst(ctx context.Context, o Options, jss []jetstream.JetStream, settledAt []atomic.Int64, res *Result) error {
	msgs := make([]*nats.Msg, o.Instances)
	for i := range msgs {
		var err error
		if msgs[i], err = rotation(Instance(i), 1, nil); err != nil {
			return err
		}
	}
	bctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	begin := time.Now()
	publishedAt, err := publish(bctx, jss, msgs)
	if err != nil {
		return fmt.Errorf("publish the burst: %w", err)
	}
	if err := waitUntil(bctx, func() (bool, string) {
		n := 0
		for i := range settledAt {
			if settledAt[i].Load() != 0 {
				n++
			}
		}
		return n == len(settledAt), fmt.Sprintf("%d of %d settled", n, len(settledAt))
	}); err != nil {
		return err
	}
	lat := make([]time.Duration, len(settledAt))
	var last int64
	for i := range settledAt {
		s := settledAt[i].Load()
		last = max(last, s)
		lat[i] = time.Duration(s - publishedAt[i])
	}
	slices.Sort(lat)
	res.Settled = len(lat)
	res.Burst = time.Duration(last - begin.UnixNano())
	res.P50, res.P99 = percentile(lat, 50), percentile(lat, 99)
	return nil
}

// percentile is the p-th percentile of sorted.
func percentile(sorted []time.Duration, p int) time.Duration {
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// benchSecret stands for a hive's age-encrypted secret: the bench's
// handlers open nothing, and its size is a real one's.
const benchSecret = "-----BEGIN AGE ENCRYPTED FILE-----\nYmVuY2g=\n-----END AGE ENCRYPTED FILE-----\n"

// rotation is version v of hive's credential rotation (rotationID),
// signed by key unless key is nil (what a hive's worker verifies before it
// applies).
func rotation(hive string, v uint64, key crypto.Signer) (*nats.Msg, error) {
	data := events.CredentialRotated{Hive: hive, Version: v, ClientID: "bench", Secret: benchSecret}
	if key != nil {
		var err error
		if data, err = signing.SignRotation(key, data); err != nil {
			return nil, err
		}
	}
	e, err := events.New(events.TypeCredentialRotated, hive, data)
	if err != nil {
		return nil, err
	}
	e.SetID(rotationID(hive, v))
	e.SetSource("/steward/bench/fleet")
	e.SetTime(time.Now().UTC())
	return events.Encode(events.EventsPrefix+".credential.rotated."+hive, e)
}

// rotationID is the id of version v of hive's rotation: fleet-<hive> for
// version 1, fleet-<hive>-<v> after.
func rotationID(hive string, v uint64) string {
	if v == 1 {
		return "fleet-" + hive
	}
	return "fleet-" + hive + "-" + strconv.FormatUint(v, 10)
}

// publishWindow is how many publishes a connection has in flight before it
// waits for their acknowledgements: below the client's async limit (4,000),
// which fails a publish past it.
const publishWindow = 1000

// publish publishes msgs at once, spread over jss, and waits until the
// server has acknowledged each; publishedAt[i] is when msgs[i] was sent,
// in Unix nanoseconds.
func publish(ctx context.Context, jss []jetstream.JetStream, msgs []*nats.Msg) ([]int64, error) {
	publishedAt := make([]int64, len(msgs))
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for c := range jss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var acks []jetstream.PubAckFuture
			wait := func() bool {
				for _, f := range acks {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						pubErr.CompareAndSwap(nil, fmt.Errorf("event %s: %w", f.Msg().Header.Get(events.MsgIDHeader), err))
						return false
					case <-ctx.Done():
						pubErr.CompareAndSwap(nil, ctx.Err())
						return false
					}
				}
				acks = acks[:0]
				return true
			}
			for i := c; i < len(msgs); i += len(jss) {
				publishedAt[i] = time.Now().UnixNano()
				f, err := jss[c].PublishMsgAsync(msgs[i])
				if err != nil {
					pubErr.CompareAndSwap(nil, err)
					return
				}
				if acks = append(acks, f); len(acks) == publishWindow && !wait() {
					return
				}
			}
			wait()
		}()
	}
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
		return nil, err
	}
	return publishedAt, nil
}

// runningInstances are a fleet's runtimes, each running until stop.
type runningInstances struct {
	ws      []*workers.Runtime
	cancel  context.CancelFunc
	running sync.WaitGroup
	// failed is the first error an instance started or stopped with.
	failed atomic.Value
}

// startInstances builds n runtimes with build, retried as `steward worker`
// retries a start while the streams are not ready, o.Parallel at a time as
// that many hosts starting at once would; runs each; and waits until all
// are consuming. Stop them with stop, also after an error.
func startInstances(ctx context.Context, o Options, n int, build func(i int) (*workers.Runtime, error)) (*runningInstances, error) {
	runCtx, cancel := context.WithCancel(context.Background())
	f := &runningInstances{ws: make([]*workers.Runtime, n), cancel: cancel}
	sctx, cancelStart := context.WithTimeout(ctx, o.Timeout)
	defer cancelStart()
	sem := make(chan struct{}, o.Parallel)
	var started sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		started.Add(1)
		go func() {
			defer func() { <-sem; started.Done() }()
			err := retry(sctx, o.Timeout, func() error {
				w, err := build(i)
				f.ws[i] = w
				return err
			})
			if err != nil {
				f.failed.CompareAndSwap(nil, fmt.Errorf("instance %d: %w", i+1, err))
				return
			}
			f.running.Add(1)
			go func() {
				defer f.running.Done()
				if err := f.ws[i].Run(runCtx); err != nil {
					f.failed.CompareAndSwap(nil, fmt.Errorf("instance %d stopped: %w", i+1, err))
				}
			}()
		}()
		if f.failed.Load() != nil {
			break
		}
	}
	started.Wait()
	if err, _ := f.failed.Load().(error); err != nil {
		return f, err
	}
	if err := waitUntil(sctx, func() (bool, string) {
		if f.failed.Load() != nil {
			return true, ""
		}
		c := 0
		for _, w := range f.ws {
			if w.Ready() == nil {
				c++
			}
		}
		return c == n, fmt.Sprintf("%d of %d consuming", c, n)
	}); err != nil {
		return f, err
	}
	err, _ := f.failed.Load().(error)
	return f, err
}

// stop ends every instance and waits until each has stopped.
func (f *runningInstances) stop() {
	f.cancel()
	f.running.Wait()
}

// retry runs fn until it succeeds or timeout passes, as `steward worker`
// retries a start while the streams or a cluster are not ready.
func retry(ctx context.Context, timeout time.Duration, fn func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	wait := 50 * time.Millisecond
	for {
		err := fn()
		if err == nil || errors.Is(err, workers.ErrInvalidSpec) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// waitUntil polls cond until it holds or ctx ends, with cond's last word.
func waitUntil(ctx context.Context, cond func() (bool, string)) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		ok, last := cond()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s", ctx.Err(), last)
		case <-t.C:
		}
	}
}
