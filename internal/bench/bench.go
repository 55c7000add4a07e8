// Package bench measures what the worker runtime costs. It publishes the
// same events, in one run on one embedded server, through four paths:
//
//   - the runtime, running a no-op worker whose Spec is not latest-wins, so
//     every event reaches the handler and is checkpointed and confirmed;
//   - a raw pull consumer that acks each event fire-and-forget (Ack);
//   - a raw pull consumer that confirms each ack serially (DoubleAck);
//   - the same serial DoubleAck consumer, decoding and validating each
//     event before its handler as the runtime does (the trust boundary,
//     without the checkpoint): what the runtime's handler latency is
//     compared with besides plain DoubleAck's, since no worker may hand an
//     unvalidated event to its handler.
//
// For each it reports events per second, two latencies, publish to the
// handler and publish to settled (the runtime's confirmed ack, the raw
// paths' ack call returned), and the process's CPU time per event. Events
// go out as one burst, or at a steady rate (Options.Rate). Figures are only
// ever compared within one run: the machines it runs on are shared, and
// absolute figures drift by a third.
//
// A run first sends a short burst through each path, unmeasured, so that
// none of them pays for the process's cold start (the heap growing, the
// streams' first files), which otherwise fell on whichever path went first.
// It then measures Options.Rounds rounds, each path once a round and the
// first path changing from round to round, and reports the median of each
// figure and of each round's ratios. Each path's consumer is deleted after
// its turn, so that no path pays for an idle one left by an earlier turn.
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
	"github.com/steward-dev/steward/workers"
)

// DefaultEvents is how many events a run publishes through each path.
const DefaultEvents = 20000

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
	// Rate, when above zero, publishes at this many events per second
	// instead of one burst.
	Rate int
	// Rounds is how many times each path is measured (default 1); the
	// report gives the medians.
	Rounds int
	// Timeout bounds each path (default 5 minutes).
	Timeout time.Duration
	// Progress, when set, is called about once a second while a path
	// runs, with how many events it has settled.
	Progress func(path string, settled, total int)
}

// Latency is one latency's distribution.
type Latency struct{ P50, P99 time.Duration }

// Measure is what one path did.
type Measure struct {
	Events int
	// Elapsed runs from the first publish to the last event settled.
	Elapsed   time.Duration
	PerSecond float64
	// Handler is publish to the handler; Settled is publish to the ack
	// confirmed (the raw paths: their ack call returned).
	Handler, Settled Latency
	// CPU is the process's CPU time per event over the path's turn: the
	// server's and the publisher's too, which are the same on every path,
	// so what differs between paths is the consumer's own and the server
	// work it asks for (a checkpoint write, a confirmed ack).
	CPU time.Duration
}

// Round is one measure of each path, taken one after the other.
type Round struct {
	Runtime       Measure
	RawAck        Measure
	RawDouble     Measure
	RawValidating Measure
}

// Ratio is the runtime's throughput as a fraction of the raw Ack path's.
func (r Round) Ratio() float64 { return ratio(r.Runtime.PerSecond, r.RawAck.PerSecond) }

// SettledRatio is the runtime's p99 publish-to-settled over the raw serial
// DoubleAck path's.
func (r Round) SettledRatio() float64 {
	return ratio(float64(r.Runtime.Settled.P99), float64(r.RawDouble.Settled.P99))
}

// HandlerRatio is the runtime's p99 publish-to-handler over the raw serial
// DoubleAck path's.
func (r Round) HandlerRatio() float64 {
	return ratio(float64(r.Runtime.Handler.P99), float64(r.RawDouble.Handler.P99))
}

// ValidatingHandlerRatio is the runtime's p99 publish-to-handler over the
// validating serial DoubleAck path's: the runtime's own cost in front of
// its handler, the decoding and validation every worker does set aside.
func (r Round) ValidatingHandlerRatio() float64 {
	return ratio(float64(r.Runtime.Handler.P99), float64(r.RawValidating.Handler.P99))
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Result is one run: the same events through the four paths, in one or
// more rounds. Its Round holds the median of each figure over the rounds,
// and its ratios are the medians of the rounds' own: a ratio compares two
// paths measured minutes apart at most.
type Result struct {
	Rate int
	Round
	Rounds []Round
}

// Ratio is the median over the rounds of the runtime's throughput as a
// fraction of the raw Ack path's.
func (r Result) Ratio() float64 { return r.median(Round.Ratio) }

// SettledRatio is the median over the rounds of the runtime's p99
// publish-to-settled over the raw serial DoubleAck path's.
func (r Result) SettledRatio() float64 { return r.median(Round.SettledRatio) }

// HandlerRatio is the median over the rounds of the runtime's p99
// publish-to-handler over the raw serial DoubleAck path's.
func (r Result) HandlerRatio() float64 { return r.median(Round.HandlerRatio) }

// ValidatingHandlerRatio is the median over the rounds of the runtime's p99
// publish-to-handler over the validating serial DoubleAck path's.
func (r Result) ValidatingHandlerRatio() float64 { return r.median(Round.ValidatingHandlerRatio) }

func (r Result) median(of func(Round) float64) float64 { return medianBy(r.Rounds, of) }

// medianBy is the median of of(x) over xs; zero for none.
func medianBy[X any, T int64 | float64](xs []X, of func(X) T) T {
	v := make([]T, len(xs))
	for i, x := range xs {
		v[i] = of(x)
	}
	return medianOf(v)
}

// medianOf is the middle value, or the mean of the two middle ones; zero
// for none.
func medianOf[T int64 | float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// medianMeasure is the median of each figure of ms, figure by figure.
func medianMeasure(ms []Measure) Measure {
	if len(ms) == 0 {
		return Measure{}
	}
	d := func(of func(Measure) time.Duration) time.Duration {
		return time.Duration(medianBy(ms, func(m Measure) int64 { return int64(of(m)) }))
	}
	return Measure{
		Events:    ms[0].Events,
		Elapsed:   d(func(m Measure) time.Duration { return m.Elapsed }),
		PerSecond: medianBy(ms, func(m Measure) float64 { return m.PerSecond }),
		CPU:       d(func(m Measure) time.Duration { return m.CPU }),
		Handler: Latency{
			P50: d(func(m Measure) time.Duration { return m.Handler.P50 }),
			P99: d(func(m Measure) time.Duration { return m.Handler.P99 }),
		},
		Settled: Latency{
			P50: d(func(m Measure) time.Duration { return m.Settled.P50 }),
			P99: d(func(m Measure) time.Duration { return m.Settled.P99 }),
		},
	}
}

// String is the report `steward bench` prints.
func (r Result) String() string {
	d := func(v time.Duration) time.Duration {
		if v < time.Millisecond {
			return v.Round(time.Microsecond)
		}
		return v.Round(10 * time.Microsecond)
	}
	line := func(name string, m Measure) string {
		return fmt.Sprintf("%-34s %6d events in %8v %9.0f events/s   handler p50 %9v p99 %9v   settled p50 %9v p99 %9v   CPU %7v/event\n",
			name, m.Events, m.Elapsed.Round(time.Millisecond), m.PerSecond,
			d(m.Handler.P50), d(m.Handler.P99), d(m.Settled.P50), d(m.Settled.P99), m.CPU.Round(time.Microsecond))
	}
	mode := "one burst"
	if r.Rate > 0 {
		mode = fmt.Sprintf("%d events/s", r.Rate)
	}
	out := fmt.Sprintf("published as %s\n", mode)
	if len(r.Rounds) > 1 {
		out = fmt.Sprintf("published as %s; medians of %d rounds\n", mode, len(r.Rounds))
	}
	for _, p := range paths {
		out += line(p.name, *p.into(&r.Round))
	}
	out += fmt.Sprintf("runtime / raw Ack throughput: %.2f\n", r.Ratio()) +
		fmt.Sprintf("runtime / raw DoubleAck p99 settled: %.2f, p99 handler: %.2f\n", r.SettledRatio(), r.HandlerRatio()) +
		fmt.Sprintf("runtime / validating raw DoubleAck p99 handler: %.2f\n", r.ValidatingHandlerRatio())
	if len(r.Rounds) > 1 {
		each := func(of func(Round) float64) string {
			v := make([]string, len(r.Rounds))
			for i, round := range r.Rounds {
				v[i] = fmt.Sprintf("%.2f", of(round))
			}
			return strings.Join(v, " ")
		}
		out += fmt.Sprintf("by round: throughput %s; p99 settled %s; p99 handler %s; p99 handler, validating %s\n",
			each(Round.Ratio), each(Round.SettledRatio), each(Round.HandlerRatio), each(Round.ValidatingHandlerRatio))
	}
	return out
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
	// spoil, set only by tests, changes the raw paths' messages before
	// they go out.
	spoil func([]*nats.Msg)
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
	if err := events.EnsureStreams(ctx, e.pubJS, events.DefaultStreamConfig()); err != nil {
		e.Close()
		return nil, err
	}
	if _, err := e.pubJS.CreateOrUpdateStream(ctx, rawStreamConfig()); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// The raw paths' stream: the same layout as STEWARD_EVENTS, its own
// subjects so the runtime's consumers never see its messages.
const (
	rawStream = "BENCH_RAW"
	rawPrefix = "bench.raw"
)

// rawStreamConfig is STEWARD_EVENTS's configuration on the raw subjects,
// its stored notices republished under a prefix of their own: the server
// does the same work to store and deliver an event on every path, so what
// the paths measure apart is the consumer.
func rawStreamConfig() jetstream.StreamConfig {
	var cfg jetstream.StreamConfig
	for _, c := range events.DefaultStreamConfig().StreamConfigs() {
		if c.Name == events.StreamEvents {
			cfg = c
		}
	}
	cfg.Name, cfg.Subjects, cfg.Description = rawStream, []string{rawPrefix + ".>"}, "the bench's raw paths"
	cfg.RePublish = &jetstream.RePublish{Source: rawPrefix + ".>", Destination: rawPrefix + "-stored.>", HeadersOnly: true}
	return cfg
}

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
// per run, so every path carries the same bytes and the cost of building
// them is in no measure.
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

// tracker records when each event was published, first handled and
// settled.
type tracker struct {
	prefix string
	// cpu is the process's CPU time when the first event went out.
	cpu     time.Duration
	sent    []atomic.Int64
	handled []atomic.Int64
	settled []atomic.Int64
	done    atomic.Int64
	all     chan struct{}
}

func newTracker(prefix string, n int) *tracker {
	return &tracker{prefix: prefix, sent: make([]atomic.Int64, n), handled: make([]atomic.Int64, n),
		settled: make([]atomic.Int64, n), all: make(chan struct{})}
}

func (t *tracker) index(id string) (int, bool) {
	i, err := strconv.Atoi(strings.TrimPrefix(id, t.prefix))
	return i, err == nil && i >= 0 && i < len(t.handled)
}

// handle notes the first handling of an event: a redelivery is not a
// second one.
func (t *tracker) handle(id string) {
	if i, ok := t.index(id); ok {
		t.handled[i].CompareAndSwap(0, time.Now().UnixNano())
	}
}

// settle notes that an event's ack is confirmed; the run ends when every
// event is.
func (t *tracker) settle(id string) {
	i, ok := t.index(id)
	if ok && t.settled[i].CompareAndSwap(0, time.Now().UnixNano()) && t.done.Add(1) == int64(len(t.settled)) {
		close(t.all)
	}
}

func distribution(lat []time.Duration) Latency {
	slices.Sort(lat)
	n := len(lat)
	return Latency{P50: lat[n*50/100], P99: lat[min(n*99/100, n-1)]}
}

func (t *tracker) measure() Measure {
	n := len(t.sent)
	handler, settled := make([]time.Duration, n), make([]time.Duration, n)
	first, last := t.sent[0].Load(), int64(0)
	for i := range n {
		s, h, d := t.sent[i].Load(), t.handled[i].Load(), t.settled[i].Load()
		handler[i], settled[i] = time.Duration(h-s), time.Duration(d-s)
		first, last = min(first, s), max(last, d)
	}
	elapsed := time.Duration(last - first)
	return Measure{
		Events: n, Elapsed: elapsed, PerSecond: float64(n) / elapsed.Seconds(),
		Handler: distribution(handler), Settled: distribution(settled),
		CPU: (processCPU() - t.cpu) / time.Duration(n),
	}
}

// publish sends msgs asynchronously, as one burst or paced at rate per
// second, noting when each left, and waits for every publish ack.
func (e *Env) publish(ctx context.Context, t *tracker, msgs []*nats.Msg, rate int) error {
	futures := make([]jetstream.PubAckFuture, len(msgs))
	t.cpu = processCPU()
	start := time.Now()
	for i, m := range msgs {
		if rate > 0 {
			// Paced against the start, so a slow publish is caught up
			// rather than stretching the whole run.
			if wait := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
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

func (e *Env) wait(ctx context.Context, t *tracker, path string, progress func(string, int, int)) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-t.all:
			return nil
		case <-tick.C:
			if progress != nil {
				progress(path, int(t.done.Load()), len(t.settled))
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d events settled before %w", path, t.done.Load(), len(t.settled), ctx.Err())
		}
	}
}

// Runtime publishes the events and waits until the runtime, running a
// worker whose handler does nothing, has settled every one.
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
	opts := []workers.Option{
		workers.WithRegisterer(prometheus.NewRegistry()),
		workers.WithSettledHook(func(s workers.Settlement) { t.settle(s.Event.ID()) }),
	}
	if o.Concurrency > 0 {
		opts = append(opts, workers.WithConcurrency(o.Concurrency))
	}
	// Earlier runs' events would be delivered too: start from an empty
	// stream.
	if err := e.purge(ctx, events.StreamEvents); err != nil {
		return Measure{}, err
	}
	w, err := workers.New(e.subJS, spec, workers.HandlerFunc(func(_ context.Context, d *workers.Delivery) error {
		t.handle(d.Event.ID())
		return nil
	}), opts...)
	if err != nil {
		return Measure{}, err
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		<-done
		e.deleteConsumer(events.StreamEvents, w.ConsumerName())
	}()
	for w.Ready() != nil {
		select {
		case <-ctx.Done():
			return Measure{}, fmt.Errorf("the bench worker did not start: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := e.publish(ctx, t, msgs, o.Rate); err != nil {
		return Measure{}, err
	}
	if err := e.wait(ctx, t, runtimePath, o.Progress); err != nil {
		return Measure{}, err
	}
	return t.measure(), nil
}

// RawConsumer is how a raw path's consumer treats each event.
type RawConsumer int

const (
	// Ack acks each event fire-and-forget.
	Ack RawConsumer = iota
	// DoubleAck confirms each ack before the next event: a serial consumer
	// that wants to know its ack landed.
	DoubleAck
	// ValidatingDoubleAck decodes and validates each event as the runtime
	// does (events.Decode, events.Validate) before its handler, then
	// confirms its ack as DoubleAck does.
	ValidatingDoubleAck
)

// String names the path as the report, its progress lines and errors do.
func (c RawConsumer) String() string {
	return [...]string{"raw consumer, Ack", "raw consumer, serial DoubleAck", "raw consumer, validating DoubleAck"}[c]
}

// runtimePath names the runtime's path as String names the raw ones.
const runtimePath = "runtime (no-op worker)"

// Raw publishes the same kind of events to a stream of their own and
// consumes them with a plain durable pull consumer, as c says.
func (e *Env) Raw(ctx context.Context, o Options, c RawConsumer) (Measure, error) {
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
	if e.spoil != nil {
		e.spoil(msgs)
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
	defer e.deleteConsumer(rawStream, cons.CachedInfo().Name)
	// invalid holds the first event the validating consumer refused.
	var invalid atomic.Pointer[error]
	cc, err := cons.Consume(func(m jetstream.Msg) {
		id := m.Headers().Get("ce-id")
		if c == ValidatingDoubleAck {
			ev, err := events.Decode(m.Headers(), m.Data())
			if err == nil {
				err = events.Validate(ev)
			}
			if err != nil {
				// Every event was validated when it was made, so this
				// is the bench's own fault: the event never settles,
				// and the path's timeout says why.
				err = fmt.Errorf("event %s: %w", id, err)
				invalid.CompareAndSwap(nil, &err)
				return
			}
		}
		t.handle(id)
		if c == Ack {
			if m.Ack() != nil {
				return
			}
		} else if m.DoubleAck(ctx) != nil {
			return
		}
		t.settle(id)
	})
	if err != nil {
		return Measure{}, err
	}
	defer cc.Stop()
	if err := e.publish(ctx, t, msgs, o.Rate); err != nil {
		return Measure{}, err
	}
	if err := e.wait(ctx, t, c.String(), o.Progress); err != nil {
		if why := invalid.Load(); why != nil {
			return Measure{}, fmt.Errorf("%w; the first event that did not validate: %w", err, *why)
		}
		return Measure{}, err
	}
	return t.measure(), nil
}

// deleteConsumer removes a path's consumer once its turn is over. A
// failure costs only fairness, since a consumer left behind is one more the
// server considers on every publish, so it is not an error.
func (e *Env) deleteConsumer(stream, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = e.pubJS.DeleteConsumer(ctx, stream, name)
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
	if o.Rounds <= 0 {
		o.Rounds = 1
	}
	return o
}

// path is one way of consuming the events: how it is measured, where a
// Round keeps its measure, and its name in the report, progress and errors.
type path struct {
	name    string
	measure func(*Env, context.Context, Options) (Measure, error)
	into    func(*Round) *Measure
}

// paths are a Round's, in the order Run starts its first round with and the
// report lists them.
var paths = []path{
	{runtimePath, (*Env).Runtime, func(r *Round) *Measure { return &r.Runtime }},
	rawPath(Ack, func(r *Round) *Measure { return &r.RawAck }),
	rawPath(DoubleAck, func(r *Round) *Measure { return &r.RawDouble }),
	rawPath(ValidatingDoubleAck, func(r *Round) *Measure { return &r.RawValidating }),
}

func rawPath(c RawConsumer, into func(*Round) *Measure) path {
	return path{c.String(), func(e *Env, ctx context.Context, o Options) (Measure, error) { return e.Raw(ctx, o, c) }, into}
}

// warmUpEvents is the size of the unmeasured burst each path gets first.
const warmUpEvents = 2000

// Run starts an embedded server, warms each path up, measures the four
// paths over the same number of events in each of o.Rounds rounds, and
// stops the server.
func Run(ctx context.Context, o Options) (Result, error) {
	o = o.withDefaults()
	env, err := Start(ctx)
	if err != nil {
		return Result{}, err
	}
	defer env.Close()
	warm := Options{Events: min(warmUpEvents, o.Events), Keys: o.Keys, Concurrency: o.Concurrency, Timeout: o.Timeout}
	for _, p := range paths {
		if _, err := p.measure(env, ctx, warm); err != nil {
			return Result{}, fmt.Errorf("%s, warming up: %w", p.name, err)
		}
	}
	res := Result{Rate: o.Rate, Rounds: make([]Round, o.Rounds)}
	for i := range res.Rounds {
		for j := range paths {
			p := paths[(i+j)%len(paths)]
			m, err := p.measure(env, ctx, o)
			if err != nil {
				return Result{}, fmt.Errorf("%s, round %d: %w", p.name, i+1, err)
			}
			*p.into(&res.Rounds[i]) = m
		}
	}
	for _, p := range paths {
		ms := make([]Measure, len(res.Rounds))
		for i := range res.Rounds {
			ms[i] = *p.into(&res.Rounds[i])
		}
		*p.into(&res.Round) = medianMeasure(ms)
	}
	return res, nil
}
