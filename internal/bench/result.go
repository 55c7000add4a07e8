package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Latency is one latency's distribution.
type Latency struct{ P50, P99 time.Duration }

// Measure is what one path did. A path not run has a zero Measure.
type Measure struct {
	Events int
	// Elapsed runs from the first publish to the last event settled.
	Elapsed   time.Duration
	PerSecond float64
	// Published is events per second from the first publish to the last
	// publish ack: what the stream's layout costs the publisher shows
	// here first.
	Published float64
	// Handler is publish to the handler; Settled is publish to the ack
	// confirmed (the raw paths: their ack call returned).
	Handler, Settled Latency
	// Checked is how long the path's own decoding and validation of an
	// event took, timed where it runs, before its handler: zero on a path
	// that does neither (raw Ack and DoubleAck, Watermill), and on the
	// runtime's, which does both before its handler is called and says
	// nothing of how long they took. A hot loop measures the same work on
	// warm caches; at a steady rate each event meets caches holding the
	// server's and the publisher's work, and costs several times as much
	// (docs/benchmarks.md, 2026-12-06).
	Checked Latency
	// CPU is the CPU time per event over the path's turn of the processes
	// taking part: the server's and the publisher's too, which are the same
	// on every path, so what differs between paths is the consumer's own
	// and the server work it asks for (a checkpoint write, a confirmed
	// ack). An external path's is its program's and the server's process's
	// over the same stretch.
	CPU time.Duration
	// ServerCPU is the server process's part of CPU, per event: what the
	// path asks of the server (storing, delivering, a checkpoint write, a
	// stored notice, a confirmed ack) apart from its own work. Zero when
	// the server is embedded (--server embedded, the go test benchmarks):
	// its CPU is then the bench process's and cannot be told apart.
	ServerCPU time.Duration
	// Alloc is the bytes allocated per event on the Go heap of the
	// process running the path (its publisher and its consumer; the
	// server's too with --server embedded), and Collections the garbage
	// collections it ran meanwhile. On 2 cores a collection's marking
	// takes a core from the handlers while it runs, so the events that
	// arrive then make some of a path's p99: a path that allocates more
	// collects more often and has more of them (docs/benchmarks.md).
	Alloc       uint64
	Collections uint64
	// Bunched is how many of the events slowest to reach their handler
	// (the slowest 1%) were published within one bunchWindow: a stall
	// that every event behind it waited out, such as the server's when a
	// stream block's write cache outgrows 4 MiB (docs/benchmarks.md,
	// 2026-12-04, later). When it is a large part of the slowest 1%, the
	// p99 is that stall's more than the path's.
	Bunched int
}

// Line is the measure as the report prints it, named name.
func (m Measure) Line(name string) string {
	d := func(v time.Duration) time.Duration {
		if v < time.Millisecond {
			return v.Round(time.Microsecond)
		}
		return v.Round(10 * time.Microsecond)
	}
	// The server's part, or as many blanks, so the columns after it line up.
	server := fmt.Sprintf("%16s", "")
	if s := m.ServerCPU.Round(time.Microsecond); s > 0 {
		server = fmt.Sprintf(" (server %6v)", s)
	}
	var checked string
	if m.Checked.P50 > 0 {
		checked = fmt.Sprintf("   decoding and validating p50 %v p99 %v", m.Checked.P50.Round(100*time.Nanosecond), m.Checked.P99.Round(100*time.Nanosecond))
	}
	return fmt.Sprintf("%-40s %6d events in %8v %9.0f events/s (published %6.0f/s)   handler p50 %9v p99 %9v (slowest 1%%: %3d within %v)   settled p50 %9v p99 %9v   CPU %7v/event%s   heap %6d B/event %3d GCs%s\n",
		name, m.Events, m.Elapsed.Round(time.Millisecond), m.PerSecond, m.Published,
		d(m.Handler.P50), d(m.Handler.P99), m.Bunched, bunchWindow, d(m.Settled.P50), d(m.Settled.P99), m.CPU.Round(time.Microsecond),
		server, m.Alloc, m.Collections, checked)
}

// Round is one measure of each path, taken one after the other. The raw
// paths' fields are named after their consumer; those on the plain stream
// have no layout in their name.
type Round struct {
	Runtime Measure
	// RuntimeOutcome is the runtime whose handler emits an outcome.
	RuntimeOutcome Measure
	// RuntimeNoNotices is the runtime on STEWARD_EVENTS without its stored
	// notices, and RuntimeUpdated the runtime with them after the same
	// updates of the stream (Options.StreamCosts).
	RuntimeNoNotices, RuntimeUpdated Measure
	// RawAck, RawDouble, RawValidating and RawCheckpointing read the
	// plain stream.
	RawAck           Measure
	RawDouble        Measure
	RawValidating    Measure
	RawCheckpointing Measure
	// ShapedAck is the raw Ack consumer on the STEWARD_EVENTS-shaped
	// stream.
	ShapedAck Measure
	// NoNotices, NoMsgID and SmallHeaders are ShapedAck with one of the
	// events stream's costs switched off (Options.StreamCosts).
	NoNotices    Measure
	NoMsgID      Measure
	SmallHeaders Measure
	// External is Options.External's path.
	External Measure
}

// ack is the raw Ack path's measure on layout l.
func (r *Round) ack(l Layout) *Measure {
	return [...]*Measure{Plain: &r.RawAck, Shaped: &r.ShapedAck, ShapedNoNotices: &r.NoNotices,
		ShapedNoMsgID: &r.NoMsgID, ShapedSmallHeaders: &r.SmallHeaders}[l]
}

// Ratio is the runtime's throughput as a fraction of the raw Ack path's on
// the plain stream.
func (r Round) Ratio() float64 { return ratio(r.Runtime.PerSecond, r.RawAck.PerSecond) }

// ShapedRatio is the runtime's throughput as a fraction of the raw Ack
// path's on the STEWARD_EVENTS-shaped stream.
func (r Round) ShapedRatio() float64 { return ratio(r.Runtime.PerSecond, r.ShapedAck.PerSecond) }

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

// CheckpointingHandlerRatio is the runtime's p99 publish-to-handler over
// the checkpointing serial DoubleAck path's: the runtime against the least
// a consumer of its own does to keep the same guarantees.
func (r Round) CheckpointingHandlerRatio() float64 {
	return ratio(float64(r.Runtime.Handler.P99), float64(r.RawCheckpointing.Handler.P99))
}

// CheckpointingSettledRatio is the runtime's p99 publish-to-settled over
// the checkpointing serial DoubleAck path's.
func (r Round) CheckpointingSettledRatio() float64 {
	return ratio(float64(r.Runtime.Settled.P99), float64(r.RawCheckpointing.Settled.P99))
}

// ExternalHandlerRatio is the runtime's p99 publish-to-handler over the
// external path's (Watermill's), zero when it was not run.
func (r Round) ExternalHandlerRatio() float64 {
	return ratio(float64(r.Runtime.Handler.P99), float64(r.External.Handler.P99))
}

// OutcomeCPU is the CPU per event of the runtime emitting an outcome as a
// multiple of the runtime's without: what signing and publishing an
// outcome adds.
func (r Round) OutcomeCPU() float64 {
	return ratio(float64(r.RuntimeOutcome.CPU), float64(r.Runtime.CPU))
}

// NoNoticesHandlerRatio is the runtime's p99 publish-to-handler without
// the stored notices over its own with them after the same updates of the
// stream (RuntimeUpdated): below 1, what the notices cost its tail.
func (r Round) NoNoticesHandlerRatio() float64 {
	return ratio(float64(r.RuntimeNoNotices.Handler.P99), float64(r.RuntimeUpdated.Handler.P99))
}

// NoNoticesDoubleAckRatio is HandlerRatio for the runtime without the
// stored notices.
func (r Round) NoNoticesDoubleAckRatio() float64 {
	return ratio(float64(r.RuntimeNoNotices.Handler.P99), float64(r.RawDouble.Handler.P99))
}

// Cost compares the raw Ack path on one layout with the same path on the
// STEWARD_EVENTS-shaped stream: what the layout switches off costs the
// shaped stream.
type Cost struct {
	// Consume and Publish are the layout's rates as multiples of the
	// shaped stream's: above 1, what it switches off slows the shaped one.
	Consume, Publish float64
	// Handler is the layout's p99 publish-to-handler as a fraction of the
	// shaped stream's: what the cost does to latency at a steady rate.
	Handler float64
	// CPU is the layout's CPU per event as a fraction of the shaped
	// stream's: below 1, what it switches off costs the shaped one CPU.
	// On a shared machine it is the steadier figure: the rates move with
	// what else runs, the CPU a process spends much less.
	CPU float64
}

// Cost is the raw Ack path on layout l against the shaped stream.
func (r Round) Cost(l Layout) Cost {
	m, base := r.ack(l), r.ack(Shaped)
	return Cost{Consume: ratio(m.PerSecond, base.PerSecond), Publish: ratio(m.Published, base.Published),
		Handler: ratio(float64(m.Handler.P99), float64(base.Handler.P99)), CPU: ratio(float64(m.CPU), float64(base.CPU))}
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Result is one run: the same events through every path, in one or more
// rounds. Its Round holds the median of each figure over the rounds, and
// its ratios are the medians of the rounds' own: a ratio compares two
// paths measured minutes apart at most.
type Result struct {
	Rate int
	Round
	Rounds []Round
	// ExternalName names Options.External's path, when it ran.
	ExternalName string
}

// Ratio is the median over the rounds of the runtime's throughput as a
// fraction of the raw Ack path's on the plain stream.
func (r Result) Ratio() float64 { return r.median(Round.Ratio) }

// ShapedRatio is the median over the rounds of the runtime's throughput
// as a fraction of the raw Ack path's on the STEWARD_EVENTS-shaped stream.
func (r Result) ShapedRatio() float64 { return r.median(Round.ShapedRatio) }

// SettledRatio is the median over the rounds of the runtime's p99
// publish-to-settled over the raw serial DoubleAck path's.
func (r Result) SettledRatio() float64 { return r.median(Round.SettledRatio) }

// HandlerRatio is the median over the rounds of the runtime's p99
// publish-to-handler over the raw serial DoubleAck path's.
func (r Result) HandlerRatio() float64 { return r.median(Round.HandlerRatio) }

// ValidatingHandlerRatio is the median over the rounds of the runtime's p99
// publish-to-handler over the validating serial DoubleAck path's.
func (r Result) ValidatingHandlerRatio() float64 { return r.median(Round.ValidatingHandlerRatio) }

// CheckpointingHandlerRatio is the median over the rounds of
// Round.CheckpointingHandlerRatio.
func (r Result) CheckpointingHandlerRatio() float64 { return r.median(Round.CheckpointingHandlerRatio) }

// CheckpointingSettledRatio is the median over the rounds of
// Round.CheckpointingSettledRatio.
func (r Result) CheckpointingSettledRatio() float64 { return r.median(Round.CheckpointingSettledRatio) }

// ExternalHandlerRatio is the median over the rounds of the runtime's p99
// publish-to-handler over the external path's.
func (r Result) ExternalHandlerRatio() float64 { return r.median(Round.ExternalHandlerRatio) }

// OutcomeCPU is the median over the rounds of Round.OutcomeCPU.
func (r Result) OutcomeCPU() float64 { return r.median(Round.OutcomeCPU) }

// NoNoticesHandlerRatio is the median of the rounds' NoNoticesHandlerRatio.
func (r Result) NoNoticesHandlerRatio() float64 { return r.median(Round.NoNoticesHandlerRatio) }

// NoNoticesDoubleAckRatio is the median of the rounds' NoNoticesDoubleAckRatio.
func (r Result) NoNoticesDoubleAckRatio() float64 { return r.median(Round.NoNoticesDoubleAckRatio) }

// Cost is the median over the rounds of each figure of Round.Cost.
func (r Result) Cost(l Layout) Cost {
	return Cost{
		Consume: r.median(func(x Round) float64 { return x.Cost(l).Consume }),
		Publish: r.median(func(x Round) float64 { return x.Cost(l).Publish }),
		Handler: r.median(func(x Round) float64 { return x.Cost(l).Handler }),
		CPU:     r.median(func(x Round) float64 { return x.Cost(l).CPU }),
	}
}

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
		Events:      ms[0].Events,
		Elapsed:     d(func(m Measure) time.Duration { return m.Elapsed }),
		PerSecond:   medianBy(ms, func(m Measure) float64 { return m.PerSecond }),
		Published:   medianBy(ms, func(m Measure) float64 { return m.Published }),
		CPU:         d(func(m Measure) time.Duration { return m.CPU }),
		ServerCPU:   d(func(m Measure) time.Duration { return m.ServerCPU }),
		Alloc:       uint64(medianBy(ms, func(m Measure) int64 { return int64(m.Alloc) })),
		Collections: uint64(medianBy(ms, func(m Measure) int64 { return int64(m.Collections) })),
		Bunched:     int(medianBy(ms, func(m Measure) int64 { return int64(m.Bunched) })),
		Handler: Latency{
			P50: d(func(m Measure) time.Duration { return m.Handler.P50 }),
			P99: d(func(m Measure) time.Duration { return m.Handler.P99 }),
		},
		Settled: Latency{
			P50: d(func(m Measure) time.Duration { return m.Settled.P50 }),
			P99: d(func(m Measure) time.Duration { return m.Settled.P99 }),
		},
		Checked: Latency{
			P50: d(func(m Measure) time.Duration { return m.Checked.P50 }),
			P99: d(func(m Measure) time.Duration { return m.Checked.P99 }),
		},
	}
}

// String is the report `steward bench` prints: one line a path, then the
// ratios the targets are stated in, then each round's.
func (r Result) String() string {
	mode := "one burst"
	if r.Rate > 0 {
		mode = fmt.Sprintf("%d events/s", r.Rate)
	}
	out := fmt.Sprintf("published as %s\n", mode)
	if len(r.Rounds) > 1 {
		out = fmt.Sprintf("published as %s; medians of %d rounds\n", mode, len(r.Rounds))
	}
	ran := r.ran()
	for _, p := range ran {
		out += p.into(&r.Round).Line(p.name)
	}
	out += fmt.Sprintf("runtime / raw Ack throughput: %.2f (plain stream), %.2f (%s)\n", r.Ratio(), r.ShapedRatio(), Shaped) +
		fmt.Sprintf("runtime / raw DoubleAck p99 settled: %.2f, p99 handler: %.2f\n", r.SettledRatio(), r.HandlerRatio()) +
		fmt.Sprintf("runtime / validating raw DoubleAck p99 handler: %.2f\n", r.ValidatingHandlerRatio())
	if r.Round.RawCheckpointing.Events > 0 {
		out += fmt.Sprintf("runtime / checkpointing raw DoubleAck p99 settled: %.2f, p99 handler: %.2f\n",
			r.CheckpointingSettledRatio(), r.CheckpointingHandlerRatio())
	}
	if r.ExternalName != "" {
		out += fmt.Sprintf("runtime / %s p99 handler: %.2f\n", r.ExternalName, r.ExternalHandlerRatio())
	}
	if r.Round.RuntimeOutcome.Events > 0 {
		out += fmt.Sprintf("runtime emitting an outcome / runtime CPU per event: %.2f\n", r.OutcomeCPU())
	}
	if r.Round.RuntimeNoNotices.Events > 0 {
		out += fmt.Sprintf("runtime without stored notices / runtime after the same stream updates p99 handler: %.2f; / raw DoubleAck p99 handler: %.2f\n",
			r.NoNoticesHandlerRatio(), r.NoNoticesDoubleAckRatio())
	}
	if costs := r.costsRun(); len(costs) > 0 {
		out += fmt.Sprintf("raw Ack against itself on %s: rates as multiples of its, p99 handler and CPU per event as fractions of its\n", Shaped)
		for _, l := range costs {
			c := r.Cost(l)
			out += fmt.Sprintf("  %-32s consume %.2f   publish %.2f   p99 handler %.2f   CPU %.2f\n", l, c.Consume, c.Publish, c.Handler, c.CPU)
		}
	}
	if len(r.Rounds) > 1 {
		each := func(of func(Round) float64) string {
			v := make([]string, len(r.Rounds))
			for i, round := range r.Rounds {
				v[i] = fmt.Sprintf("%.2f", of(round))
			}
			return strings.Join(v, " ")
		}
		out += fmt.Sprintf("by round: throughput %s (shaped %s); p99 settled %s; p99 handler %s; p99 handler, validating %s",
			each(Round.Ratio), each(Round.ShapedRatio), each(Round.SettledRatio), each(Round.HandlerRatio), each(Round.ValidatingHandlerRatio))
		if r.Round.RawCheckpointing.Events > 0 {
			out += fmt.Sprintf("; against checkpointing p99 settled %s, p99 handler %s",
				each(Round.CheckpointingSettledRatio), each(Round.CheckpointingHandlerRatio))
		}
		if r.ExternalName != "" {
			out += fmt.Sprintf("; p99 handler, %s %s", r.ExternalName, each(Round.ExternalHandlerRatio))
		}
		if r.Round.RuntimeOutcome.Events > 0 {
			out += fmt.Sprintf("; outcome CPU %s", each(Round.OutcomeCPU))
		}
		if r.Round.RuntimeNoNotices.Events > 0 {
			out += fmt.Sprintf("; without stored notices, p99 handler %s (against raw DoubleAck %s)",
				each(Round.NoNoticesHandlerRatio), each(Round.NoNoticesDoubleAckRatio))
		}
		for _, l := range r.costsRun() {
			out += fmt.Sprintf("; %s %s (CPU %s)", l, each(func(x Round) float64 { return x.Cost(l).Consume }),
				each(func(x Round) float64 { return x.Cost(l).CPU }))
		}
		out += "\n"
	}
	return out
}

// ran are the paths the run measured, in the report's order.
func (r Result) ran() []path {
	var out []path
	for _, p := range allPaths(r.ExternalName) {
		if p.into(&r.Round).Events > 0 {
			out = append(out, p)
		}
	}
	return out
}

// costsRun are the layouts whose raw Ack path ran besides the shaped one.
func (r Result) costsRun() []Layout {
	var out []Layout
	for _, l := range layouts {
		if l != Shaped && r.Round.ack(l).Events > 0 && r.Round.ack(Shaped).Events > 0 {
			out = append(out, l)
		}
	}
	return out
}
