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

	// Start the instances, o.Parallel at a time, as that many hosts
	// starting at once would.
	o.Progress("starting %d instances", o.Instances)
	settledAt := make([]atomic.Int64, o.Instances)
	reg := prometheus.NewRegistry()
	runCtx, stopAll := context.WithCancel(context.Background())
	var running sync.WaitGroup
	defer func() { stopAll(); running.Wait() }()
	ws := make([]*workers.Runtime, o.Instances)
	startAt := time.Now()
	sctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	sem := make(chan struct{}, o.Parallel)
	var startErr atomic.Value
	var started sync.WaitGroup
	for i := range o.Instances {
		sem <- struct{}{}
		started.Add(1)
		go func() {
			defer func() { <-sem; started.Done() }()
			js := jss[i%len(jss)]
			err := retry(sctx, o.Timeout, func() error {
				w, err := workers.New(js, Spec(i), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
					return d.Emit(ctx, "applied", map[string]any{"hive": d.Key})
				}), workers.WithRegisterer(reg), workers.WithReadMode(o.ReadMode), workers.WithSettledHook(func(s workers.Settlement) {
					settledAt[i].CompareAndSwap(0, s.Settled.UnixNano())
				}))
				ws[i] = w
				return err
			})
			if err != nil {
				startErr.CompareAndSwap(nil, fmt.Errorf("instance %s: %w", Instance(i), err))
				return
			}
			running.Add(1)
			go func() {
				defer running.Done()
				if err := ws[i].Run(runCtx); err != nil {
					startErr.CompareAndSwap(nil, fmt.Errorf("instance %s stopped: %w", Instance(i), err))
				}
			}()
		}()
		if startErr.Load() != nil {
			break
		}
	}
	started.Wait()
	if err, _ := startErr.Load().(error); err != nil {
		return res, err
	}
	if err := waitUntil(sctx, func() (bool, string) {
		if err, _ := startErr.Load().(error); err != nil {
			return true, ""
		}
		n := 0
		for _, w := range ws {
			if w.Ready() == nil {
				n++
			}
		}
		return n == len(ws), fmt.Sprintf("%d of %d consuming", n, len(ws))
	}); err != nil {
		return res, err
	}
	if err, _ := startErr.Load().(error); err != nil {
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
		hive := Instance(i)
		e, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{
			Hive: hive, Version: 1, ClientID: "bench",
			Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nYmVuY2g=\n-----END AGE ENCRYPTED FILE-----\n",
		})
		if err != nil {
			return err
		}
		e.SetID("fleet-" + hive)
		e.SetSource("/steward/bench/fleet")
		e.SetTime(time.Now().UTC())
		if msgs[i], err = events.Encode(events.EventsPrefix+".credential.rotated."+hive, e); err != nil {
			return err
		}
	}
	publishedAt := make([]int64, o.Instances)
	bctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	begin := time.Now()
	var wg sync.WaitGroup
	var pubErr atomic.Value
	for c := range jss {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var acks []jetstream.PubAckFuture
			for i := c; i < len(msgs); i += len(jss) {
				publishedAt[i] = time.Now().UnixNano()
				f, err := jss[c].PublishMsgAsync(msgs[i])
				if err != nil {
					pubErr.CompareAndSwap(nil, err)
					return
				}
				acks = append(acks, f)
			}
			for _, f := range acks {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					pubErr.CompareAndSwap(nil, err)
					return
				case <-bctx.Done():
					pubErr.CompareAndSwap(nil, bctx.Err())
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := pubErr.Load().(error); err != nil {
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
	res.P50 = lat[len(lat)/2]
	res.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	return nil
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
