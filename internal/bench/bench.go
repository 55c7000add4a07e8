// Package bench measures what the worker runtime costs against what a user
// would pick instead. It publishes the same events, in one run on one
// embedded server, through these paths:
//
//   - the runtime, running a no-op worker whose Spec is not latest-wins, so
//     every event reaches the handler and is checkpointed and confirmed, on
//     the streams `steward setup` makes (events.SetupBus), and the same
//     worker emitting a signed outcome for every event, as real workers do;
//   - raw pull consumers on a plain stream, made as a nats.go user makes
//     one (Layout Plain): one acking each event fire-and-forget (Ack), one
//     confirming each ack serially (DoubleAck), and the same serial
//     consumer decoding and validating each event before its handler as the
//     runtime does (the trust boundary, without the checkpoint), since no
//     worker may hand an unvalidated event to its handler, and that
//     consumer writing each event's key's checkpoint with compare-and-set
//     before confirming its ack (CheckpointingDoubleAck): the least a
//     consumer of its own does to keep the runtime's guarantees, so what
//     is left against the runtime is the runtime's own;
//   - the raw Ack consumer on a stream laid out as STEWARD_EVENTS is, stored
//     notices included (Layout Shaped): a reference that reads the same
//     kind of stream as the runtime;
//   - with Options.StreamCosts, the same raw Ack consumer on the shaped
//     stream with one of its costs switched off at a time: the stored
//     notices, the Nats-Msg-Id header the duplicate window tracks, and the
//     CloudEvents headers;
//   - with Options.External, a path measured by a program of its own
//     (ExternalMain): the Watermill subscriber lives in a module of its own,
//     internal/bench/watermill, so that the product does not depend on it.
//
// For each it reports events per second consumed and published, two
// latencies, publish to the handler and publish to settled (the runtime's
// confirmed ack, the raw paths' ack call returned), and the CPU time per
// event of the processes taking part. Events go out as one burst, or at a
// steady rate (Options.Rate). Figures are only ever compared within one
// run: the machines it runs on are shared, and absolute figures drift by a
// third.
//
// A run first sends a short burst through each path, unmeasured, so that
// none of them pays for the process's cold start (the heap growing, the
// streams' first files), which otherwise fell on whichever path went first.
// It then measures Options.Rounds rounds, each path once a round and the
// first path changing from round to round, and reports the median of each
// figure and of each round's ratios. Each path's consumer is deleted after
// its turn, so that no path pays for an idle one left by an earlier turn,
// and the garbage is collected before each turn, so that none pays for the
// garbage of the one before.
package bench

import (
	"context"
	"fmt"
	"runtime"
	"time"
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
	// StreamCosts adds the raw Ack paths on the STEWARD_EVENTS-shaped
	// stream with one of its costs switched off each (ShapedNoNotices,
	// ShapedNoMsgID, ShapedSmallHeaders), and the runtime on
	// STEWARD_EVENTS without its stored notices (RuntimeWithoutNotices).
	StreamCosts bool
	// External, when set, adds a path measured by a program of its own.
	External *External
	// ServerCommand, when set, runs the server in a process of its own
	// (StartProcess), as deployed workers meet theirs; otherwise it is
	// embedded in this process (Start), and every path shares its garbage
	// collector with the server's.
	ServerCommand []string
	// Timeout bounds each path (default 5 minutes).
	Timeout time.Duration
	// Progress, when set, is called about once a second while a path
	// runs, with how many events it has settled.
	Progress func(path string, settled, total int)
	// measuring, when set, is called just before a turn's first event
	// goes out: an external path's program says so to the bench that
	// runs it, which then starts counting its server's CPU.
	measuring func()
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
	// wanted says whether Options ask for the path; nil is always.
	wanted func(Options) bool
	// external paths warm up in their own program, a process of its own
	// for each turn.
	external bool
}

// allPaths are every path a Round can hold, in the order Run starts its
// first round with and the report lists them; external names the external
// path, if any.
func allPaths(external string) []path {
	costs := func(o Options) bool { return o.StreamCosts }
	return []path{
		{name: runtimePath, measure: (*Env).Runtime, into: func(r *Round) *Measure { return &r.Runtime }},
		{name: outcomePath, measure: (*Env).RuntimeOutcome, into: func(r *Round) *Measure { return &r.RuntimeOutcome }},
		{name: runtimeNoNoticesPath, measure: (*Env).RuntimeWithoutNotices, into: func(r *Round) *Measure { return &r.RuntimeNoNotices }, wanted: costs},
		{name: runtimeUpdatedPath, measure: (*Env).RuntimeAfterUpdate, into: func(r *Round) *Measure { return &r.RuntimeUpdated }, wanted: costs},
		rawPath(Ack, Plain, func(r *Round) *Measure { return &r.RawAck }, nil),
		rawPath(DoubleAck, Plain, func(r *Round) *Measure { return &r.RawDouble }, nil),
		rawPath(ValidatingDoubleAck, Plain, func(r *Round) *Measure { return &r.RawValidating }, nil),
		rawPath(CheckpointingDoubleAck, Plain, func(r *Round) *Measure { return &r.RawCheckpointing }, nil),
		{name: external, measure: (*Env).External, into: func(r *Round) *Measure { return &r.External },
			wanted: func(o Options) bool { return o.External != nil }, external: true},
		rawPath(Ack, Shaped, func(r *Round) *Measure { return &r.ShapedAck }, nil),
		rawPath(Ack, ShapedNoNotices, func(r *Round) *Measure { return &r.NoNotices }, costs),
		rawPath(Ack, ShapedNoMsgID, func(r *Round) *Measure { return &r.NoMsgID }, costs),
		rawPath(Ack, ShapedSmallHeaders, func(r *Round) *Measure { return &r.SmallHeaders }, costs),
	}
}

func rawPath(c RawConsumer, l Layout, into func(*Round) *Measure, wanted func(Options) bool) path {
	return path{name: rawName(c, l), into: into, wanted: wanted,
		measure: func(e *Env, ctx context.Context, o Options) (Measure, error) { return e.Raw(ctx, o, c, l) }}
}

// pathsFor are the paths o asks for.
func pathsFor(o Options) []path {
	var name string
	if o.External != nil {
		name = o.External.Name
	}
	var out []path
	for _, p := range allPaths(name) {
		if p.wanted == nil || p.wanted(o) {
			out = append(out, p)
		}
	}
	return out
}

// warmUpEvents is the size of the unmeasured burst each path gets first.
const warmUpEvents = 2000

// Run starts a server (embedded, or in its own process when
// o.ServerCommand is set), warms each path up, measures the paths o asks
// for over the same number of events in each of o.Rounds rounds, and
// stops the server.
func Run(ctx context.Context, o Options) (Result, error) {
	o = o.withDefaults()
	start := Start
	if len(o.ServerCommand) > 0 {
		start = func(ctx context.Context) (*Env, error) { return StartProcess(ctx, o.ServerCommand) }
	}
	env, err := start(ctx)
	if err != nil {
		return Result{}, err
	}
	defer env.Close()
	paths := pathsFor(o)
	warm := o
	warm.Events, warm.Rate, warm.Progress = min(warmUpEvents, o.Events), 0, nil
	for _, p := range paths {
		if p.external {
			continue
		}
		if _, err := p.measure(env, ctx, warm); err != nil {
			return Result{}, fmt.Errorf("%s, warming up: %w", p.name, err)
		}
	}
	res := Result{Rate: o.Rate, Rounds: make([]Round, o.Rounds)}
	if o.External != nil {
		res.ExternalName = o.External.Name
	}
	for i := range res.Rounds {
		for j := range paths {
			p := paths[(i+j)%len(paths)]
			// The garbage an earlier turn left would be collected in this
			// one, on its CPU and its latencies: the path after the
			// validating one, say, paid for that one's decoding.
			runtime.GC()
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
