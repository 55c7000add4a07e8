package bench

import (
	"context"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
)

// TestRunMeasuresEveryPath proves a small run handles every event on each
// path, the stream costs' and an external program's included, and reports
// sane figures: positive rates and CPU, p50 <= p99, elapsed time covering
// the latencies.
func TestRunMeasuresEveryPath(t *testing.T) {
	res, err := Run(context.Background(), Options{Events: 300, Keys: 8, Timeout: time.Minute, StreamCosts: true, External: testChild(t, "")})
	if err != nil {
		t.Fatal(err)
	}
	// Where getrusage is missing, CPU reads zero (cpu_other.go).
	cpu := processCPU() > 0
	ran := res.ran()
	if len(ran) != len(allPaths("")) {
		t.Fatalf("%d paths ran, want all %d:\n%s", len(ran), len(allPaths("")), res)
	}
	for _, p := range ran {
		if m := *p.into(&res.Round); m.Events != 300 || m.PerSecond <= 0 || m.Published <= 0 || m.Handler.P50 <= 0 || m.Handler.P50 > m.Handler.P99 ||
			m.Settled.P50 < m.Handler.P50 || m.Settled.P99 < m.Handler.P99 || m.Settled.P99 > m.Elapsed || (cpu && m.CPU <= 0) || m.Alloc == 0 ||
			m.Bunched < 1 || m.Bunched > 3 || m.ServerCPU != 0 {
			t.Fatalf("%s: %+v", p.name, m)
		}
	}
	// The heap's counters are each path's own stretch too: emitting an
	// outcome (encoded, signed, published) allocates on top of what the
	// no-op runtime does for every event.
	if rt, oc := res.Round.Runtime.Alloc, res.Round.RuntimeOutcome.Alloc; oc <= rt {
		t.Fatalf("the runtime emitting an outcome allocated %d B an event, the no-op runtime %d", oc, rt)
	}
	// Each in-process path's CPU is its own stretch of the process's, so
	// per event and summed over the paths it fits in what the process has
	// used (the external path's is partly its program's).
	var spent time.Duration
	for _, p := range ran {
		if m := *p.into(&res.Round); !p.external {
			spent += m.CPU * time.Duration(m.Events)
		}
	}
	if used := processCPU(); spent > used {
		t.Fatalf("the paths' CPU adds up to %v, more than the %v the process has used", spent, used)
	}
	if res.Ratio() <= 0 || res.ShapedRatio() <= 0 || res.ValidatingHandlerRatio() <= 0 || res.ExternalHandlerRatio() <= 0 {
		t.Fatalf("ratios %v, %v, %v and %v", res.Ratio(), res.ShapedRatio(), res.ValidatingHandlerRatio(), res.ExternalHandlerRatio())
	}
	for _, l := range []Layout{Plain, ShapedNoNotices, ShapedNoMsgID, ShapedSmallHeaders} {
		if c := res.Cost(l); c.Consume <= 0 || c.Publish <= 0 || c.Handler <= 0 || (cpu && c.CPU <= 0) {
			t.Fatalf("%s: cost %+v", l, c)
		}
	}
	report := res.String()
	// The server is embedded: its CPU is this process's, and no line
	// claims a part of it.
	if strings.Contains(report, "(server") {
		t.Fatalf("the report gives the embedded server's part:\n%s", report)
	}
	if cpu && res.OutcomeCPU() <= 0 {
		t.Fatalf("outcome CPU ratio %v", res.OutcomeCPU())
	}
	if res.NoNoticesHandlerRatio() <= 0 || res.NoNoticesDoubleAckRatio() <= 0 {
		t.Fatalf("ratios without stored notices %v and %v", res.NoNoticesHandlerRatio(), res.NoNoticesDoubleAckRatio())
	}
	for _, want := range []string{"/event", "B/event", "published", "runtime / test child p99 handler", "raw Ack against itself on STEWARD_EVENTS-shaped", "runtime emitting an outcome / runtime CPU per event", "runtime without stored notices / runtime after the same stream updates p99 handler"} {
		if !strings.Contains(report, want) {
			t.Fatalf("the report leaves out %q:\n%s", want, report)
		}
	}
	for _, p := range ran {
		if !strings.Contains(report, p.name) {
			t.Fatalf("the report leaves out %s:\n%s", p.name, report)
		}
	}
	t.Log("\n" + res.String())
}

// TestRunWithTheServerInAProcessOfItsOwn proves `steward bench`'s default:
// the server runs in a process of its own, every path still settles every
// event, the server's CPU counts in each path's CPU per event, and Run uses
// the command it is given.
func TestRunWithTheServerInAProcessOfItsOwn(t *testing.T) {
	ctx := context.Background()
	self := []string{os.Args[0], "fleet-server"}
	env, err := StartProcess(ctx, self)
	if err != nil {
		t.Fatal(err)
	}
	pid := env.node.Nodes[0].Pid()
	if env.srv != nil || pid == os.Getpid() {
		t.Fatalf("the server is in this process (embedded %v, pid %d)", env.srv != nil, pid)
	}
	// The server's start alone takes more than /proc's 10 ms tick, so its
	// CPU is above zero; read after both, the total holds both.
	own := processCPU()
	serverCPU, err := env.node.Nodes[0].CPU()
	if err != nil || serverCPU <= 0 {
		t.Fatalf("the server's CPU: %v, %v", serverCPU, err)
	}
	if all := env.cpu(); all.all < own+serverCPU || all.server < serverCPU {
		t.Fatalf("CPU counted %+v, this process's %v and the server's %v: the server's is left out", all, own, serverCPU)
	}
	env.Close()
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("the server's process %d outlived Close", pid)
	}

	res, err := Run(ctx, Options{Events: 200, Keys: 8, Timeout: time.Minute, ServerCommand: self})
	if err != nil {
		t.Fatal(err)
	}
	if m := res.Runtime; m.Events != 200 || m.PerSecond <= 0 || m.Handler.P50 > m.Handler.P99 {
		t.Fatalf("runtime: %+v", m)
	}
	if m := res.RawDouble; m.Events != 200 || m.PerSecond <= 0 {
		t.Fatalf("raw DoubleAck: %+v", m)
	}
	// Each path's server part is within its CPU, and the server did
	// work in the run: /proc counts its CPU in 10 ms ticks, which one
	// path's 200 events may not fill, but the run's paths together do.
	// Together they are also less than all of it: this process published
	// and consumed.
	var served, spent time.Duration
	for _, p := range res.ran() {
		m := *p.into(&res.Round)
		if m.ServerCPU < 0 || m.ServerCPU > m.CPU {
			t.Fatalf("%s: the server's part %v of CPU %v", p.name, m.ServerCPU, m.CPU)
		}
		served += m.ServerCPU * time.Duration(m.Events)
		spent += m.CPU * time.Duration(m.Events)
	}
	if served <= 0 || served >= spent {
		t.Fatalf("the server's part of the paths' CPU is %v of %v:\n%s", served, spent, res)
	}
	// Run starts the server it is given, not an embedded one: a command
	// that cannot start fails the run, and says so.
	missing := []string{"/no/such/nats-server"}
	if _, err := Run(ctx, Options{Events: 10, Timeout: time.Minute, ServerCommand: missing}); err == nil ||
		!strings.Contains(err.Error(), "nats-server in its own process") || !strings.Contains(err.Error(), missing[0]) {
		t.Fatalf("Run with a server command that cannot start: %v", err)
	}
}

// TestRunLeavesOutWhatItIsNotAskedFor proves the stream costs' paths and
// the external one are measured only when asked for: a run without them
// names none of them.
func TestRunLeavesOutWhatItIsNotAskedFor(t *testing.T) {
	res, err := Run(context.Background(), Options{Events: 100, Keys: 4, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.NoNotices.Events != 0 || res.NoMsgID.Events != 0 || res.SmallHeaders.Events != 0 || res.External.Events != 0 || res.RuntimeNoNotices.Events != 0 || res.RuntimeUpdated.Events != 0 {
		t.Fatalf("paths not asked for ran: %+v", res.Round)
	}
	if res.RawAck.Events != 100 || res.ShapedAck.Events != 100 {
		t.Fatalf("the plain and shaped raw Ack paths did not both run: %+v", res.Round)
	}
	if report := res.String(); strings.Contains(report, ShapedNoNotices.String()) || strings.Contains(report, "p99 handler, ") {
		t.Fatalf("the report names paths that did not run:\n%s", report)
	}
}

// TestRuntimeWithoutNoticesRunsWithoutThem proves the runtime's turn
// without stored notices runs on STEWARD_EVENTS republishing none (and the
// control's turn after the same updates, and the runtime's own, on it
// republishing one an event), that the control updates the stream as
// often as the turn it is held against (the server's update advisories,
// counted), and that the stream has its notices again after it.
func TestRuntimeWithoutNoticesRunsWithoutThem(t *testing.T) {
	ctx := context.Background()
	env, err := Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var notices, updates atomic.Int64
	sub, err := env.subNC.Subscribe(events.StoredPrefix+".>", func(*nats.Msg) { notices.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	adv, err := env.subNC.Subscribe("$JS.EVENT.ADVISORY.STREAM.UPDATED."+events.StreamEvents, func(*nats.Msg) { updates.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer adv.Unsubscribe()
	// Both subscriptions in place on the server before the first update.
	if err := env.subNC.Flush(); err != nil {
		t.Fatal(err)
	}
	o := Options{Events: 100, Keys: 4, Timeout: time.Minute}
	for _, turn := range []struct {
		name             string
		measure          func(*Env, context.Context, Options) (Measure, error)
		notices, updates int64
	}{
		{"without stored notices", (*Env).RuntimeWithoutNotices, 0, 2},
		{"after the same updates of the stream", (*Env).RuntimeAfterUpdate, 100, 2},
		{"with them", (*Env).Runtime, 100, 0},
	} {
		notices.Store(0)
		updates.Store(0)
		m, err := turn.measure(env, ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		// Every event is settled, so every notice was sent before the
		// flush's answer; the subscription's handler may still be
		// counting the last ones.
		if err := env.subNC.Flush(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); (notices.Load() < turn.notices || updates.Load() < turn.updates) && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		if m.Events != 100 || notices.Load() != turn.notices {
			t.Fatalf("the runtime %s settled %d events with %d stored notices, want 100 with %d", turn.name, m.Events, notices.Load(), turn.notices)
		}
		if updates.Load() != turn.updates {
			t.Fatalf("the runtime %s came with %d updates of %s, want %d: the control must differ from the turn without notices in the notices alone", turn.name, updates.Load(), events.StreamEvents, turn.updates)
		}
	}
	s, err := env.pubJS.Stream(ctx, events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if rp := s.CachedInfo().Config.RePublish; rp == nil || rp.Source != events.DefaultNotices {
		t.Fatalf("after the turns, STEWARD_EVENTS republishes %+v, want every event's stored notices again", rp)
	}
}

// TestRoundsReportMediansAndTheirOwnRatios proves a run of three rounds
// measures every path three times, reports the median of each figure, and
// takes its ratios as the median of each round's, not the ratio of the
// medians; and that a path leaves no consumer behind for the next.
func TestRoundsReportMediansAndTheirOwnRatios(t *testing.T) {
	res, err := Run(context.Background(), Options{Events: 200, Keys: 8, Rounds: 3, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rounds) != 3 {
		t.Fatalf("%d rounds, want 3", len(res.Rounds))
	}
	var rates, ratios, validating []float64
	for i, r := range res.Rounds {
		if r.Runtime.Events != 200 || r.RawAck.Events != 200 || r.RawDouble.Events != 200 || r.RawValidating.Events != 200 || r.RawCheckpointing.Events != 200 || r.ShapedAck.Events != 200 {
			t.Fatalf("round %d: %+v", i+1, r)
		}
		rates, ratios = append(rates, r.Runtime.PerSecond), append(ratios, r.SettledRatio())
		validating = append(validating, r.ValidatingHandlerRatio())
	}
	if got, want := res.Runtime.PerSecond, medianOf(rates); got != want {
		t.Fatalf("runtime rate %v, want the median of %v", got, rates)
	}
	if got, want := res.SettledRatio(), medianOf(ratios); got != want {
		t.Fatalf("settled ratio %v, want the median of the rounds' %v", got, ratios)
	}
	if got, want := res.ValidatingHandlerRatio(), medianOf(validating); got != want {
		t.Fatalf("validating handler ratio %v, want the median of the rounds' %v", got, validating)
	}
	if !strings.Contains(res.String(), "medians of 3 rounds") || !strings.Contains(res.String(), "by round:") {
		t.Fatalf("the report does not say it gives medians, or the rounds:\n%s", res)
	}
}

func TestMedians(t *testing.T) {
	if got := medianOf([]float64{3, 1, 2}); got != 2 {
		t.Fatalf("median of 3,1,2 = %v", got)
	}
	if got := medianOf([]float64{}); got != 0 {
		t.Fatalf("median of nothing = %v, want 0", got)
	}
	if got := medianOf([]int64{4, 1, 3, 2}); got != 2 {
		t.Fatalf("median of 4,1,3,2 = %v, want 2 (the mean of 2 and 3, in integers)", got)
	}
	ms := []Measure{
		{Events: 5, PerSecond: 10, Handler: Latency{P50: 1, P99: 9}, Settled: Latency{P50: 2, P99: 30}, Checked: Latency{P50: 6, P99: 40}, Bunched: 1, ServerCPU: 5},
		{Events: 5, PerSecond: 30, Handler: Latency{P50: 3, P99: 7}, Settled: Latency{P50: 4, P99: 10}, Checked: Latency{P50: 8, P99: 60}, Bunched: 9, ServerCPU: 1},
		{Events: 5, PerSecond: 20, Handler: Latency{P50: 2, P99: 8}, Settled: Latency{P50: 3, P99: 20}, Checked: Latency{P50: 7, P99: 50}, Bunched: 4, ServerCPU: 3},
	}
	want := Measure{Events: 5, PerSecond: 20, Handler: Latency{P50: 2, P99: 8}, Settled: Latency{P50: 3, P99: 20}, Checked: Latency{P50: 7, P99: 50}, Bunched: 4, ServerCPU: 3}
	if got := medianMeasure(ms); got != want {
		t.Fatalf("median measure %+v, want %+v (each figure's own median)", got, want)
	}
}

// TestLineGivesTheServersPart proves a report line gives the server's part
// of a path's CPU when there is one to give, and keeps its columns when
// there is none (an embedded server), or less than a microsecond of it.
func TestLineGivesTheServersPart(t *testing.T) {
	m := Measure{Events: 1, CPU: 865 * time.Microsecond, ServerCPU: 409 * time.Microsecond}
	if line := m.Line("path"); !strings.Contains(line, "CPU   865µs/event (server  409µs)   heap") {
		t.Fatalf("the line does not give the server's part: %s", line)
	}
	for _, part := range []time.Duration{0, 400 * time.Nanosecond} {
		m.ServerCPU = part
		line := m.Line("path")
		if strings.Contains(line, "(server") || !strings.Contains(line, "CPU   865µs/event"+strings.Repeat(" ", 16)+"   heap") {
			t.Fatalf("with a server's part of %v: %s", part, line)
		}
	}
}

// TestBunchedCountsTheSlowestPublishedTogether feeds a tracker a turn of
// 10,000 events published a millisecond apart whose slowest 1% is a stall
// (30 events published in a row) and 70 slow ones 100 ms apart, and
// requires the measure to count the stall's 30: not the scattered ones,
// not events outside the slowest 1%, and the same whatever the stall's
// events' latencies.
func TestBunchedCountsTheSlowestPublishedTogether(t *testing.T) {
	const n = 10000
	turn := func(stalled time.Duration) Measure {
		tr := newTracker("e-", n, func() cpuUse { return cpuUse{} })
		start := time.Now().UnixNano()
		for i := range n {
			sent := start + int64(i)*int64(time.Millisecond)
			lat := 300 * time.Microsecond
			switch {
			case i >= 5000 && i < 5030:
				lat = stalled + time.Duration(5030-i)*time.Millisecond
			case i%100 == 50 && i/100 < 70:
				lat = 3 * time.Millisecond
			case i >= 7000 && i < 7035:
				// Published together, but not slow enough to be among
				// the slowest 1%.
				lat = 2 * time.Millisecond
			}
			tr.sent[i].Store(sent)
			tr.handled[i].Store(sent + int64(lat))
			tr.settled[i].Store(sent + int64(lat) + int64(time.Millisecond))
		}
		return tr.measure()
	}
	for _, stalled := range []time.Duration{4 * time.Millisecond, 40 * time.Millisecond} {
		m := turn(stalled)
		if m.Bunched != 30 {
			t.Fatalf("a stall of 30 events (the longest %v): %d of the slowest 1%% counted as published within %v, want 30", stalled+30*time.Millisecond, m.Bunched, bunchWindow)
		}
		if m.Handler.P99 < 3*time.Millisecond {
			t.Fatalf("p99 handler %v: the slowest 1%% is not the turn's slow events", m.Handler.P99)
		}
	}
	if line := turn(4 * time.Millisecond).Line("path"); !strings.Contains(line, "slowest 1%:  30 within 40ms") {
		t.Fatalf("the report line does not give the bunched count: %s", line)
	}
}

// TestMeasureCountsNoneOfItsOwnAllocations ends a turn of 10,000 settled
// events, in which the path allocated 64 bytes an event, and measures it at
// once: the heap figure must be the path's 64, neither counting the slices
// measure builds to compute the percentiles (32 bytes an event) nor missing
// what the path allocated. What else the test binary allocates meanwhile
// is far under the 8 bytes an event allowed.
func TestMeasureCountsNoneOfItsOwnAllocations(t *testing.T) {
	const n, perEvent = 10000, 64
	tr := newTracker("e-", n, func() cpuUse { return cpuUse{} })
	start := time.Now().UnixNano()
	for i := range n {
		tr.sent[i].Store(start + int64(i))
		tr.handled[i].Store(start + int64(i) + 300)
		tr.settled[i].Store(start + int64(i) + 600)
		tr.checked[i].Store(10)
	}
	tr.cpu, tr.heap = tr.cpuNow(), heapNow()
	// One large allocation, which the heap's counters take at once (small
	// ones are counted as their spans fill): the path's work in the turn.
	pathWork := make([]byte, n*perEvent)
	m := tr.measure()
	runtime.KeepAlive(pathWork)
	if m.Alloc < perEvent || m.Alloc >= perEvent+8 {
		t.Fatalf("a turn whose path allocated %d bytes an event measured %d: the measure counted its own work, or missed the path's", perEvent, m.Alloc)
	}
}

// TestOutcomePathStoresASignedOutcomePerEvent proves the outcome path
// measures what it says: every event's handler emitted an outcome that
// STEWARD_OUTCOMES stored, signed, before the event settled.
func TestOutcomePathStoresASignedOutcomePerEvent(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const n = 120
	if m, err := env.RuntimeOutcome(context.Background(), Options{Events: n, Timeout: time.Minute}); err != nil || m.Events != n {
		t.Fatalf("outcome path: %+v, %v", m, err)
	}
	s, err := env.pubJS.Stream(context.Background(), events.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("STEWARD_OUTCOMES holds %d outcomes, want one for each of the %d events", info.State.Msgs, n)
	}
	first, err := s.GetMsg(context.Background(), info.State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	if first.Header.Get(proof.Header) == "" {
		t.Fatalf("the outcome on %s carries no %s: it was not signed", first.Subject, proof.Header)
	}
}

// TestEnvRunsAgain proves successive runs on one server each see only
// their own events (the benchmark harness calls it repeatedly).
func TestEnvRunsAgain(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, n := range []int{50, 120} {
		m, err := env.Runtime(context.Background(), Options{Events: n, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if m.Events != n {
			t.Fatalf("runtime measured %d events, want %d", m.Events, n)
		}
		for _, c := range []RawConsumer{Ack, DoubleAck, ValidatingDoubleAck, CheckpointingDoubleAck} {
			if m, err = env.Raw(context.Background(), Options{Events: n, Timeout: time.Minute}, c, Plain); err != nil || m.Events != n {
				t.Fatalf("%s: %+v, %v", rawName(c, Plain), m, err)
			}
		}
		for _, l := range layouts {
			if m, err = env.Raw(context.Background(), Options{Events: n, Timeout: time.Minute}, Ack, l); err != nil || m.Events != n {
				t.Fatalf("%s: %+v, %v", rawName(Ack, l), m, err)
			}
		}
	}
	// Each path deleted its consumer when its turn was over.
	for _, stream := range []string{events.StreamEvents, Plain.stream(), Shaped.stream(), ShapedNoNotices.stream()} {
		s, err := env.pubJS.Stream(context.Background(), stream)
		if err != nil {
			t.Fatal(err)
		}
		names := s.ConsumerNames(context.Background())
		for name := range names.Name() {
			t.Errorf("consumer %s is left on %s after its turn", name, stream)
		}
		if err := names.Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestValidatingPathRefusesWhatDoesNotValidate proves the validating raw
// consumer does the runtime's validation: an event whose data breaks its
// schema never reaches its handler there, and the path's error names it,
// while the plain DoubleAck consumer, which validates nothing, settles it.
func TestValidatingPathRefusesWhatDoesNotValidate(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	env.spoil = func(msgs []*nats.Msg) { msgs[3].Data = []byte(`{"hive":"h3"}`) }
	o := Options{Events: 10, Keys: 4, Timeout: 3 * time.Second}
	if m, err := env.Raw(context.Background(), o, DoubleAck, Plain); err != nil || m.Events != 10 {
		t.Fatalf("plain DoubleAck: %+v, %v", m, err)
	}
	_, err = env.Raw(context.Background(), o, ValidatingDoubleAck, Plain)
	if err == nil || !strings.Contains(err.Error(), "9 of 10 events settled") ||
		!strings.Contains(err.Error(), "did not settle: event "+env.idPrefix(env.runs)+"3 did not validate") {
		t.Fatalf("validating DoubleAck with an invalid event: %v", err)
	}
}

// TestValidatingPathsTimeTheirDecodingAndValidation proves the paths that
// decode and validate report how long that took where it ran, and the
// others report nothing: each event's timing ends as its handler is
// marked, so no percentile of it can exceed the same percentile of
// publish to the handler.
func TestValidatingPathsTimeTheirDecodingAndValidation(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	o := Options{Events: 200, Keys: 8, Timeout: time.Minute}
	for _, c := range []RawConsumer{Ack, DoubleAck, ValidatingDoubleAck, CheckpointingDoubleAck} {
		m, err := env.Raw(context.Background(), o, c, Plain)
		if err != nil {
			t.Fatalf("%s: %v", rawName(c, Plain), err)
		}
		line := m.Line(rawName(c, Plain))
		if !c.validates() {
			if m.Checked != (Latency{}) || strings.Contains(line, "decoding and validating") {
				t.Fatalf("%s validates nothing, yet reports %+v: %s", rawName(c, Plain), m.Checked, line)
			}
			continue
		}
		if m.Checked.P50 <= 0 || m.Checked.P50 > m.Checked.P99 || m.Checked.P50 > m.Handler.P50 || m.Checked.P99 > m.Handler.P99 {
			t.Fatalf("%s: decoding and validating %+v, publish to the handler %+v", rawName(c, Plain), m.Checked, m.Handler)
		}
		if !strings.Contains(line, "decoding and validating p50 ") {
			t.Fatalf("%s: the line does not give the decoding and validation: %s", rawName(c, Plain), line)
		}
	}
}

// TestCheckpointingPathWritesEachKeysLastSequence proves the checkpointing
// raw consumer does what it stands for: after its turn, every key's
// checkpoint holds the stream sequence of the key's last event, in a
// bucket that keeps one version of it; and when another writer has taken
// a key's checkpoint first, this consumer's writes lose their race, the
// key's events do not settle, and the path's error names the first of
// them and the checkpoint.
func TestCheckpointingPathWritesEachKeysLastSequence(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	ctx := context.Background()
	const n, keys = 40, 4
	if m, err := env.Raw(ctx, Options{Events: n, Keys: keys, Timeout: time.Minute}, CheckpointingDoubleAck, Plain); err != nil || m.Events != n {
		t.Fatalf("checkpointing DoubleAck: %+v, %v", m, err)
	}
	kv, err := env.pubJS.KeyValue(ctx, rawCheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := env.pubJS.Stream(ctx, Plain.stream())
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		hive := "h" + strconv.Itoa(k)
		last, err := stream.GetLastMsgForSubject(ctx, Plain.prefix()+".credential.rotated."+hive)
		if err != nil {
			t.Fatal(err)
		}
		entry, err := kv.Get(ctx, "r"+strconv.Itoa(env.runs)+"."+hive)
		if err != nil {
			t.Fatalf("key %s: %v", hive, err)
		}
		if got, want := string(entry.Value()), strconv.FormatUint(last.Sequence, 10); got != want {
			t.Errorf("key %s's checkpoint holds %s, want %s, its last event's sequence", hive, got, want)
		}
		if entry.Revision() == 0 {
			t.Errorf("key %s's checkpoint has no revision", hive)
		}
	}
	history, err := kv.History(ctx, "r"+strconv.Itoa(env.runs)+".h0")
	if err != nil {
		t.Fatal(err)
	}
	if len(history) != 1 {
		t.Errorf("the bucket keeps %d versions of a checkpoint, want 1 as nats.go makes a bucket", len(history))
	}

	// Another writer has written h2's checkpoint before this consumer's
	// first write of it, which creates the key: that write loses its race,
	// and so does the key's second event's. Neither may be acked: while
	// the path waits for them, its consumer, with every event delivered,
	// still holds both unacked (a consumer that acked before writing would
	// hold at most the one it is working on).
	turn := env.runs + 1
	next := "r" + strconv.Itoa(turn) + ".h2"
	if _, err := kv.Put(ctx, next, []byte("0")); err != nil {
		t.Fatal(err)
	}
	var held bool
	progress := func(string, int, int) {
		c, err := stream.Consumer(ctx, "raw-"+strconv.Itoa(turn))
		if err != nil {
			return
		}
		if info, err := c.Info(ctx); err == nil && info.Delivered.Consumer >= 8 && info.NumAckPending >= 2 {
			held = true
		}
	}
	_, err = env.Raw(ctx, Options{Events: 8, Keys: keys, Timeout: 3 * time.Second, Progress: progress}, CheckpointingDoubleAck, Plain)
	if err == nil || !strings.Contains(err.Error(), "6 of 8 events settled") ||
		!strings.Contains(err.Error(), "did not settle: event "+env.idPrefix(env.runs)+"2: the checkpoint "+next+" was not written, so the event is not acked") {
		t.Fatalf("checkpointing DoubleAck after another writer took a checkpoint: %v", err)
	}
	if !held {
		t.Fatal("with all 8 events delivered, the consumer never held the 2 whose checkpoints were not written unacked: they were acked without their checkpoint")
	}
}

// TestRunAtASteadyRate proves the paced mode publishes at about the rate
// asked: 200 events at 400/s take at least half a second.
func TestRunAtASteadyRate(t *testing.T) {
	res, err := Run(context.Background(), Options{Events: 200, Keys: 8, Rate: 400, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.Runtime.Elapsed < 450*time.Millisecond || res.RawDouble.Elapsed < 450*time.Millisecond {
		t.Fatalf("200 events at 400/s took %v and %v; the rate was not kept", res.Runtime.Elapsed, res.RawDouble.Elapsed)
	}
	if !strings.Contains(res.String(), "400 events/s") {
		t.Fatalf("the report does not say the rate:\n%s", res)
	}
}

// TestStartSetsUpTheBusAsSetupDoes proves the runtime's path reads the
// streams and bucket `steward setup` makes (events.SetupBus): they are
// there, with its configuration, before any worker has started.
func TestStartSetsUpTheBusAsSetupDoes(t *testing.T) {
	env, err := Start(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	ctx := context.Background()
	kv, err := env.pubJS.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatalf("the checkpoint bucket is not there before any worker: %v", err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		t.Fatalf("bucket status %T", st)
	}
	if got, want := bs.StreamInfo().Config.MaxBytes, int64(events.DefaultCheckpointMaxBytes); got != want {
		t.Fatalf("checkpoint bucket max bytes %d, want setup's %d", got, want)
	}
	for _, want := range events.DefaultBusConfig(1).Streams.StreamConfigs() {
		s, err := env.pubJS.Stream(ctx, want.Name)
		if err != nil {
			t.Fatal(err)
		}
		got := s.CachedInfo().Config
		if got.MaxConsumers != want.MaxConsumers || got.MaxBytes != want.MaxBytes || got.Duplicates != want.Duplicates ||
			!reflect.DeepEqual(got.RePublish, want.RePublish) || got.AllowDirect != want.AllowDirect {
			t.Fatalf("stream %s is %+v, want setup's %+v", want.Name, got, want)
		}
	}
}

// BenchmarkPipeline publishes b.N events through each path and reports
// the rates, the runtime's p99 settled and its ratio to plain raw Ack.
// Run it with a fixed count: go test -bench Pipeline -benchtime 20000x ./internal/bench
func BenchmarkPipeline(b *testing.B) {
	res, err := Run(context.Background(), Options{Events: b.N})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(res.Runtime.PerSecond, "events/s")
	b.ReportMetric(res.RawAck.PerSecond, "raw-ack-events/s")
	b.ReportMetric(res.RawDouble.PerSecond, "raw-double-events/s")
	b.ReportMetric(res.ShapedAck.PerSecond, "shaped-ack-events/s")
	b.ReportMetric(float64(res.Runtime.Settled.P99.Microseconds())/1000, "settled-p99-ms")
	b.ReportMetric(res.Ratio(), "ratio")
}

// BenchmarkSteady is BenchmarkPipeline at 1,000 events per second: the
// latencies, not the rate, are what it measures.
func BenchmarkSteady(b *testing.B) {
	res, err := Run(context.Background(), Options{Events: b.N, Rate: 1000})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(res.Runtime.Settled.P99.Microseconds())/1000, "settled-p99-ms")
	b.ReportMetric(float64(res.RawDouble.Settled.P99.Microseconds())/1000, "raw-double-settled-p99-ms")
	b.ReportMetric(res.SettledRatio(), "settled-ratio")
	b.ReportMetric(res.HandlerRatio(), "handler-ratio")
}

// BenchmarkStreamCosts measures the raw Ack consumer alone on each layout,
// b.N events a turn, in 6 rounds whose first layout changes from round to
// round, and reports each layout's median CPU per event and publish rate:
// with no other path between them, more rounds fit in the same time than
// `steward bench --stream-costs` takes, and on a shared machine the CPU per
// event is what steadies with rounds. Run it with a fixed count:
// go test -run '^$' -bench StreamCosts -benchtime 10000x ./internal/bench
func BenchmarkStreamCosts(b *testing.B) {
	env, err := Start(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer env.Close()
	o := Options{Events: b.N, Timeout: 5 * time.Minute}
	rounds := make([]Round, 6)
	for _, l := range layouts {
		if _, err := env.Raw(context.Background(), Options{Events: min(warmUpEvents, b.N), Timeout: o.Timeout}, Ack, l); err != nil {
			b.Fatal(err)
		}
	}
	for i := range rounds {
		for j := range layouts {
			l := layouts[(i+j)%len(layouts)]
			runtime.GC()
			m, err := env.Raw(context.Background(), o, Ack, l)
			if err != nil {
				b.Fatal(err)
			}
			*rounds[i].ack(l) = m
		}
	}
	res := Result{Rounds: rounds}
	for _, l := range layouts {
		ms := make([]Measure, len(rounds))
		for i := range rounds {
			ms[i] = *rounds[i].ack(l)
		}
		m := medianMeasure(ms)
		name := strings.NewReplacer(" ", "-", ",", "", "STEWARD_EVENTS-", "").Replace(l.String())
		b.ReportMetric(float64(m.CPU.Nanoseconds())/1000, name+"-cpu-µs/event")
		b.ReportMetric(m.Published, name+"-published/s")
		if l != Shaped {
			b.ReportMetric(res.Cost(l).CPU, name+"-cpu-ratio")
		}
	}
}

// The notices' ratio holds the turn without them against the control
// after the same stream updates, not against the runtime's own turn, so
// that the two turns differ in the notices alone.
func TestNoticesRatioIsAgainstTheControl(t *testing.T) {
	r := Round{
		Runtime:          Measure{Handler: Latency{P99: 5 * time.Millisecond}},
		RuntimeUpdated:   Measure{Handler: Latency{P99: 10 * time.Millisecond}},
		RuntimeNoNotices: Measure{Handler: Latency{P99: 8 * time.Millisecond}},
	}
	if got := r.NoNoticesHandlerRatio(); got != 0.8 {
		t.Fatalf("NoNoticesHandlerRatio = %v, want 0.8 (8 ms against the control's 10)", got)
	}
}
