// Package bench measures what the worker runtime costs: it publishes the
// same events through a no-op worker run by the runtime and through a plain
// JetStream pull consumer with explicit acks, on one embedded server, and
// reports events per second and publish-to-handled latency for both.
package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
)

// DefaultEvents is how many events a run publishes through each path.
const DefaultEvents = 10000

// Options says what to measure.
type Options struct {
	// Events is how many events go through each path (default
	// DefaultEvents).
	Events int
	// Keys is how many distinct keys the events spread over (default 64):
	// the runtime handles one event per key at a time.
	Keys int
	// Concurrency is the runtime's WithConcurrency (default the runtime's).
	Concurrency int
	// Timeout bounds each path (default 5 minutes).
	Timeout time.Duration
}

// Measure is what one path did.
type Measure struct {
	Events int
	// Elapsed runs from the first publish to the last event handled.
	Elapsed   time.Duration
	PerSecond float64
	// P50 and P99 are publish-to-handled latencies.
	P50, P99 time.Duration
}

// Result is one run: the runtime and the raw consumer over the same
// messages.
type Result struct {
	Runtime Measure
	Raw     Measure
}

// Ratio is the runtime's throughput as a fraction of the raw consumer's.
func (r Result) Ratio() float64 {
	if r.Raw.PerSecond == 0 {
		return 0
	}
	return r.Runtime.PerSecond / r.Raw.PerSecond
}

// String is the report `steward bench` prints.
func (r Result) String() string {
	line := func(name string, m Measure) string {
		return fmt.Sprintf("%-34s %6d events in %8v  %9.0f events/s  p50 %8v  p99 %8v\n",
			name, m.Events, m.Elapsed.Round(time.Millisecond), m.PerSecond, m.P50.Round(10*time.Microsecond), m.P99.Round(10*time.Microsecond))
	}
	return line("runtime (no-op worker)", r.Runtime) +
		line("raw pull consumer, explicit ack", r.Raw) +
		fmt.Sprintf("runtime / raw throughput: %.2f\n", r.Ratio())
}

// Env is an embedded JetStream server with its store in a temporary
// folder, and a publishing and a consuming connection to it.
type Env struct {
	srv   *server.Server
	dir   string
	pubNC *nats.Conn
	subNC *nats.Conn
	pubJS jetstream.JetStream
	subJS jetstream.JetStream
	runs  int
}

// Start starts the server and ensures Steward's streams and the raw
// stream.
func Start(ctx context.Context) (*Env, error) {
	dir, err := os.MkdirTemp("", "steward-bench-")
	if err != nil {
		return nil, err
	}
	e := &Env{dir: dir}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	e.srv = srv
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		e.Close()
		return nil, errors.New("embedded NATS did not become ready in 10s")
	}
	for _, c := range []**nats.Conn{&e.pubNC, &e.subNC} {
		if *c, err = nats.Connect(srv.ClientURL()); err != nil {
			e.Close()
			return nil, err
		}
	}
	if e.pubJS, err = jetstream.New(e.pubNC, jetstream.WithPublishAsyncMaxPending(1024)); err != nil {
		e.Close()
		return nil, err
	}
	if e.subJS, err = jetstream.New(e.subNC); err != nil {
		e.Close()
		return nil, err
	}
	if err := publisher.EnsureStreams(ctx, e.pubJS, publisher.DefaultStreamConfig()); err != nil {
		e.Close()
		return nil, err
	}
	if _, err := e.pubJS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name: rawStream, Subjects: []string{rawPrefix + ".>"}, Storage: jetstream.FileStorage,
		Duplicates: 2 * time.Minute,
	}); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// The raw path's stream: the same layout as STEWARD_EVENTS, its own
// subjects so the runtime's consumers never see its messages.
const (
	rawStream = "BENCH_RAW"
	rawPrefix = "bench.raw"
)

// Close stops the server and removes its store.
func (e *Env) Close() {
	for _, nc := range []*nats.Conn{e.pubNC, e.subNC} {
		if nc != nil {
			nc.Close()
		}
	}
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
	}
	os.RemoveAll(e.dir)
}

// messages encodes n valid credential.rotated events over keys keys, once
// per run, so both paths carry the same bytes and the cost of building
// them is in neither measure.
func (e *Env) messages(run, n, keys int) ([]*nats.Msg, error) {
	out := make([]*nats.Msg, n)
	for i := range n {
		hive := "h" + strconv.Itoa(i%keys)
		ev, err := events.New(events.TypeCredentialRotated, hive, events.CredentialRotated{
			Hive: hive, Version: uint64(i + 1), ClientID: "bench",
			Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nYmVuY2g=\n-----END AGE ENCRYPTED FILE-----\n",
		})
		if err != nil {
			return nil, err
		}
		ev.SetID(idPrefix(run) + strconv.Itoa(i))
		ev.SetSource("/steward/bench")
		ev.SetTime(time.Now().UTC())
		if err := events.Validate(ev); err != nil {
			return nil, err
		}
		k, _ := events.Lookup(ev.Type())
		subject, err := k.SubjectFor(hive)
		if err != nil {
			return nil, err
		}
		if out[i], err = events.Encode(subject, ev); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func idPrefix(run int) string { return "bench-" + strconv.Itoa(run) + "-" }

// tracker records when each event was published and first handled.
type tracker struct {
	prefix  string
	sent    []atomic.Int64
	handled []atomic.Int64
	done    atomic.Int64
	all     chan struct{}
}

func newTracker(prefix string, n int) *tracker {
	return &tracker{prefix: prefix, sent: make([]atomic.Int64, n), handled: make([]atomic.Int64, n), all: make(chan struct{})}
}

func (t *tracker) mark(id string) {
	now := time.Now().UnixNano()
	i, err := strconv.Atoi(strings.TrimPrefix(id, t.prefix))
	if err != nil || i < 0 || i >= len(t.handled) {
		return
	}
	// A redelivery is not a second handling: the first one counts.
	if t.handled[i].CompareAndSwap(0, now) && t.done.Add(1) == int64(len(t.handled)) {
		close(t.all)
	}
}

func (t *tracker) measure() Measure {
	n := len(t.sent)
	lat := make([]time.Duration, n)
	first, last := t.sent[0].Load(), int64(0)
	for i := range n {
		s, h := t.sent[i].Load(), t.handled[i].Load()
		lat[i] = time.Duration(h - s)
		first, last = min(first, s), max(last, h)
	}
	slices.Sort(lat)
	elapsed := time.Duration(last - first)
	return Measure{
		Events: n, Elapsed: elapsed,
		PerSecond: float64(n) / elapsed.Seconds(),
		P50:       lat[n*50/100], P99: lat[min(n*99/100, n-1)],
	}
}

// publish sends msgs asynchronously, noting when each left, and waits
// for every ack.
func (e *Env) publish(ctx context.Context, t *tracker, msgs []*nats.Msg) error {
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		t.sent[i].Store(time.Now().UnixNano())
		f, err := e.pubJS.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("publish %d: %w", i, err)
		}
		futures[i] = f
	}
	select {
	case <-e.pubJS.PublishAsyncComplete():
	case <-ctx.Done():
		return fmt.Errorf("waiting for publish acks: %w", ctx.Err())
	}
	for i, f := range futures {
		select {
		case err := <-f.Err():
			return fmt.Errorf("publish %d: %w", i, err)
		default:
		}
	}
	return nil
}

func (e *Env) wait(ctx context.Context, t *tracker, what string) error {
	select {
	case <-t.all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %d of %d events handled before %w", what, t.done.Load(), len(t.handled), ctx.Err())
	}
}

// Runtime publishes n events and waits until the runtime, running a
// worker whose handler does nothing, has handled every one.
func (e *Env) Runtime(ctx context.Context, o Options) (Measure, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	e.runs++
	msgs, err := e.messages(e.runs, o.Events, o.Keys)
	if err != nil {
		return Measure{}, err
	}
	t := newTracker(idPrefix(e.runs), o.Events)
	spec := workers.Spec{
		Name: "bench", Instance: "run" + strconv.Itoa(e.runs),
		Subjects: []string{events.EventsPrefix + ".credential.rotated.>"},
		Types:    []string{events.TypeCredentialRotated},
	}
	opts := []workers.Option{workers.WithRegisterer(prometheus.NewRegistry())}
	if o.Concurrency > 0 {
		opts = append(opts, workers.WithConcurrency(o.Concurrency))
	}
	// Earlier runs' events would be delivered too: start from an empty
	// stream.
	if err := e.purge(ctx, publisher.StreamEvents); err != nil {
		return Measure{}, err
	}
	w, err := workers.New(ctx, e.subJS, spec, workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
		t.mark(d.Event.ID())
		return nil
	}), opts...)
	if err != nil {
		return Measure{}, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() { stop(); <-done }()
	for w.Ready() != nil {
		select {
		case <-ctx.Done():
			return Measure{}, fmt.Errorf("the bench worker did not start: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := e.publish(ctx, t, msgs); err != nil {
		return Measure{}, err
	}
	if err := e.wait(ctx, t, "runtime"); err != nil {
		return Measure{}, err
	}
	return t.measure(), nil
}

// Raw publishes the same kind of events to a stream of their own and
// consumes them with a plain durable pull consumer, acking each explicitly:
// the floor the runtime is compared with.
func (e *Env) Raw(ctx context.Context, o Options) (Measure, error) {
	o = o.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	e.runs++
	msgs, err := e.messages(e.runs, o.Events, o.Keys)
	if err != nil {
		return Measure{}, err
	}
	for _, m := range msgs {
		m.Subject = rawPrefix + strings.TrimPrefix(m.Subject, events.EventsPrefix)
	}
	if err := e.purge(ctx, rawStream); err != nil {
		return Measure{}, err
	}
	t := newTracker(idPrefix(e.runs), o.Events)
	cons, err := e.subJS.CreateOrUpdateConsumer(ctx, rawStream, jetstream.ConsumerConfig{
		Durable:   "raw-" + strconv.Itoa(e.runs),
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		return Measure{}, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		t.mark(m.Headers().Get("ce-id"))
		_ = m.Ack()
	})
	if err != nil {
		return Measure{}, err
	}
	defer cc.Stop()
	if err := e.publish(ctx, t, msgs); err != nil {
		return Measure{}, err
	}
	if err := e.wait(ctx, t, "raw consumer"); err != nil {
		return Measure{}, err
	}
	return t.measure(), nil
}

func (e *Env) purge(ctx context.Context, stream string) error {
	s, err := e.pubJS.Stream(ctx, stream)
	if err != nil {
		return err
	}
	return s.Purge(ctx)
}

func (o Options) withDefaults() Options {
	if o.Events <= 0 {
		o.Events = DefaultEvents
	}
	if o.Keys <= 0 {
		o.Keys = 64
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	return o
}

// Run starts an embedded server, measures the runtime and the raw consumer
// over the same number of events, and stops the server.
func Run(ctx context.Context, o Options) (Result, error) {
	env, err := Start(ctx)
	if err != nil {
		return Result{}, err
	}
	defer env.Close()
	rt, err := env.Runtime(ctx, o)
	if err != nil {
		return Result{}, fmt.Errorf("runtime: %w", err)
	}
	raw, err := env.Raw(ctx, o)
	if err != nil {
		return Result{}, fmt.Errorf("raw consumer: %w", err)
	}
	return Result{Runtime: rt, Raw: raw}, nil
}
