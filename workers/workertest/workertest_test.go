package workertest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/workertest"
)

// fakeTB records what a helper reports instead of failing the test, so a
// test can prove the helper fails on a wrong expectation. Fatal stops the
// helper's goroutine as testing.T does.
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	errors []string
	fatal  bool
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Error(args ...any) { f.Errorf("%s", fmt.Sprint(args...)) }

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	f.mu.Lock()
	f.fatal = true
	f.mu.Unlock()
	runtimeGoexit()
}

func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }

// run calls fn with a fake TB on a goroutine of its own (Fatal ends it) and
// returns what fn reported.
func run(t *testing.T, fn func(tb testing.TB)) *fakeTB {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f
}

// mustFail checks that fn reported a failure mentioning each of want.
func mustFail(t *testing.T, what string, fn func(tb testing.TB), want ...string) {
	t.Helper()
	f := run(t, fn)
	if len(f.errors) == 0 {
		t.Fatalf("%s: the helper accepted a wrong expectation", what)
	}
	all := strings.Join(f.errors, "\n")
	for _, w := range want {
		if !strings.Contains(all, w) {
			t.Errorf("%s: the failure %q does not say %q", what, all, w)
		}
	}
}

// mustPass checks that fn reported nothing.
func mustPass(t *testing.T, what string, fn func(tb testing.TB)) {
	t.Helper()
	if f := run(t, fn); len(f.errors) > 0 {
		t.Fatalf("%s: the helper failed a right expectation: %s", what, strings.Join(f.errors, "\n"))
	}
}

// A rotation-like worker: latest-wins by the version in the data, state
// "current" holds the newest applied, an older version is refused.
type rotated struct {
	Hive     string `json:"hive"`
	Version  uint64 `json:"version"`
	ClientID string `json:"clientId"`
	Secret   string `json:"secret"`
}

type current struct {
	Version uint64 `json:"version"`
}

func spec(h *versions) workers.Spec {
	return workers.Spec{
		Name: "demo", Instance: "h1",
		Subjects: []string{"steward.events.credential.rotated.h1"},
		Types:    []string{events.TypeCredentialRotated},
		Rank: func(_ context.Context, d *workers.Delivery) (uint64, error) {
			var r rotated
			if err := d.DataAs(&r); err != nil {
				return 0, err
			}
			if r.ClientID == "forged" {
				return 0, errors.New("does not verify")
			}
			return r.Version, nil
		},
	}
}

// versions is the handler; fail makes a client id's rotation fail.
type versions struct {
	fail map[string]error
	ran  []uint64
}

func (v *versions) Handle(ctx context.Context, d *workers.Delivery) error {
	var r rotated
	if err := d.DataAs(&r); err != nil {
		return err
	}
	v.ran = append(v.ran, r.Version)
	if err := v.fail[r.ClientID]; err != nil {
		return err
	}
	if r.ClientID == "panic" {
		panic("boom")
	}
	if err := d.SaveStage(ctx, map[string]uint64{"writing": r.Version}); err != nil {
		return err
	}
	var cur current
	rev, err := d.State().Get(ctx, "current", &cur)
	if err != nil {
		return err
	}
	if r.Version <= cur.Version {
		if err := d.Emit(ctx, "skipped", map[string]uint64{"version": r.Version, "applied": cur.Version}); err != nil {
			return err
		}
		return workers.Refused(fmt.Errorf("version %d is not above %d", r.Version, cur.Version))
	}
	if _, err := d.State().Put(ctx, "current", current{Version: r.Version}, rev); err != nil {
		return err
	}
	return d.Emit(ctx, "applied", map[string]uint64{"version": r.Version})
}

func rotation(t testing.TB, version uint64, clientID string) event.Event {
	t.Helper()
	e, err := events.New(events.TypeCredentialRotated, "h1", rotated{Hive: "h1", Version: version, ClientID: clientID, Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----"})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(fmt.Sprintf("rot-%d-%s", version, clientID))
	e.SetSource("/test")
	return e
}

func TestWorkAppliesOneEventAndRecordsWhatItDid(t *testing.T) {
	h := &versions{}
	res := workertest.Work(t, spec(h), h, rotation(t, 3, "c3"))
	res.AssertVerdicts(workertest.Applied)
	res.AssertOutcomes("applied")
	res.AssertDeadLetters()
	res.AssertStages(map[string]uint64{"writing": 3})
	res.AssertState("current", current{Version: 3})
	if res.Err() != nil {
		t.Fatal(res.Err())
	}
	o := res.Outcome("applied")
	// The runtime's ids and types: <worker>-<instance>-<seq>, one an event.
	if o.ID() != "demo-h1-1" || o.Type() != events.OutcomeType("demo", "applied") || o.Source() != "/steward/demo/h1" || o.Subject() != "h1" {
		t.Fatalf("outcome %s %s %s %s", o.ID(), o.Type(), o.Source(), o.Subject())
	}
	if got := workertest.OutcomeAs[map[string]uint64](res, "applied"); got["version"] != 3 {
		t.Fatalf("applied %v", got)
	}
	if got := workertest.StateAs[current](res, "current"); got.Version != 3 {
		t.Fatalf("state %v", got)
	}
}

func TestResultRulesAreTheRuntimes(t *testing.T) {
	h := &versions{fail: map[string]error{
		"bad":   workers.Permanent(errors.New("cannot be processed")),
		"flaky": errors.New("database is down"),
	}}
	// The worker reads the release subject too, so that an event of a type
	// it does not handle reaches it, as on a consumer filtered that way.
	r := workertest.NewRunner(t, workers.Spec{Name: "demo", Instance: "h1", Subjects: []string{"steward.events.credential.rotated.h1", "steward.events.release.published"}, Types: []string{events.TypeCredentialRotated}}, h)
	r.Work(rotation(t, 5, "c5")).AssertVerdicts(workertest.Applied)

	stale := r.Work(rotation(t, 4, "c4"))
	stale.AssertVerdicts(workertest.Refused)
	stale.AssertOutcomes("skipped")
	stale.AssertDeadLetters()
	if !workers.IsRefused(stale.Err()) {
		t.Fatalf("a refusal's error %v", stale.Err())
	}

	bad := r.Work(rotation(t, 6, "bad"))
	bad.AssertVerdicts(workertest.DeadLettered)
	bad.AssertDeadLetters("cannot be processed")
	if dl := bad.DeadLetters[0]; dl.Worker != "demo-h1" || dl.Sequence != 3 || dl.EventID() != "rot-6-bad" || dl.Subject != "steward.events.credential.rotated.h1" {
		t.Fatalf("dead letter %+v", dl)
	}

	flaky := r.Work(rotation(t, 7, "flaky"))
	flaky.AssertVerdicts(workertest.Retried)
	flaky.AssertOutcomes()
	if flaky.Err() == nil || !strings.Contains(flaky.Err().Error(), "database is down") {
		t.Fatalf("retried error %v", flaky.Err())
	}

	p := r.Work(rotation(t, 8, "panic"))
	p.AssertVerdicts(workertest.DeadLettered)
	p.AssertDeadLetters("the handler panicked 5 times, the last with: handler panicked on h1 (event rot-8-panic): boom")
	if p.Events[0].Attempts != workers.DefaultMaxPanics {
		t.Fatalf("a panic was tried %d times", p.Events[0].Attempts)
	}

	// Invalid events never reach the handler.
	before := len(h.ran)
	wrong, err := events.New(events.TypeReleasePublished, "1.2.3", events.ReleasePublished{Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	r.Work(wrong).AssertDeadLetters(`worker demo does not handle type "dev.steward.release.published.v1"`)
	if len(h.ran) != before {
		t.Fatal("the handler ran an invalid event")
	}

	// An event on a subject the worker does not consume never reaches
	// it: a server never delivers it.
	other, err := events.New(events.TypeCredentialRotated, "h2", rotated{Hive: "h2", Version: 1, ClientID: "c", Secret: "x"})
	if err != nil {
		t.Fatal(err)
	}
	gone := r.Work(other)
	gone.AssertVerdicts(workertest.Undelivered)
	gone.AssertOutcomes()
	gone.AssertDeadLetters()
	if len(h.ran) != before {
		t.Fatal("the handler ran an event on a subject the worker does not consume")
	}
}

func TestRecordedStreamIsSupersededAsTheRuntimeWould(t *testing.T) {
	h := &versions{}
	res := workertest.Replay(t, []event.Event{
		rotation(t, 1, "c1"), rotation(t, 3, "c3"), rotation(t, 99, "forged"), rotation(t, 2, "c2"),
	}, spec(h), h)
	// 1 loses to 3 (queued behind it); 3 has nothing ranked at or above it
	// behind it (the forged 99 does not verify, 2 is older); the forged one
	// is handled in its turn, and 2 is refused as stale.
	res.AssertVerdicts(workertest.Superseded, workertest.Applied, workertest.Applied, workertest.Refused)
	res.AssertOutcomes("superseded", "applied", "applied", "skipped")
	sup := workertest.OutcomeAs[events.Superseded](res, events.OutcomeSuperseded)
	if sup.EventID != "rot-1-c1" || sup.SupersededBy != "rot-3-c3" || sup.SupersededBySequence != 2 {
		t.Fatalf("superseded %+v", sup)
	}
	if fmt.Sprint(h.ran) != "[3 99 2]" {
		t.Fatalf("the handler ran %v", h.ran)
	}
}

func TestRetriedEventHoldsItsKey(t *testing.T) {
	h := &versions{fail: map[string]error{"c1": errors.New("down")}}
	s := spec(h)
	s.Rank = nil
	res := workertest.Replay(t, []event.Event{rotation(t, 1, "c1"), rotation(t, 2, "c2")}, s, h)
	res.AssertVerdicts(workertest.Retried, workertest.Waiting)
}

func TestRedeliveredFindsTheStageAndSaveStageCanFail(t *testing.T) {
	var found map[string]uint64
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		found = nil
		if _, err := d.LoadStage(&found); err != nil {
			return err
		}
		if d.Attempt != 2 {
			return fmt.Errorf("attempt %d", d.Attempt)
		}
		return d.SaveStage(ctx, map[string]uint64{"step": 2})
	})
	s := workers.Spec{Name: "demo", Instance: "h1", Subjects: []string{"steward.events.credential.rotated.h1"}, Types: []string{events.TypeCredentialRotated}}
	res := workertest.Work(t, s, h, rotation(t, 1, "c1"), workertest.Redelivered(map[string]uint64{"step": 1}))
	res.AssertVerdicts(workertest.Applied)
	res.AssertStages(map[string]uint64{"step": 2})
	if found["step"] != 1 {
		t.Fatalf("LoadStage found %v", found)
	}
	res = workertest.Work(t, s, h, rotation(t, 1, "c1"), workertest.Redelivered(nil), workertest.SaveStageFails(events.ErrConflict))
	res.AssertVerdicts(workertest.Retried)
	if !errors.Is(res.Err(), events.ErrConflict) {
		t.Fatalf("error %v", res.Err())
	}
}

// TestRunnerStateConflictsAsTheBucketDoes: a Runner's State is the
// runtime's own over a bucket in memory, with the bucket's revisions and
// compare-and-swap.
func TestRunnerStateConflictsAsTheBucketDoes(t *testing.T) {
	ctx := context.Background()
	st := workertest.NewRunner(t, spec(&versions{}), &versions{}).State()
	var v current
	if rev, err := st.Get(ctx, "current", &v); rev != 0 || err != nil {
		t.Fatalf("missing: %d %v", rev, err)
	}
	rev, err := st.Put(ctx, "current", current{1}, 0)
	if err != nil || rev == 0 {
		t.Fatalf("create: %d %v", rev, err)
	}
	if _, err := st.Put(ctx, "current", current{2}, 0); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("create over an existing document: %v", err)
	}
	if _, err := st.Put(ctx, "current", current{2}, rev+7); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("put over a stale revision: %v", err)
	}
	other, err := st.Put(ctx, "other", current{9}, 0)
	if err != nil || other <= rev {
		t.Fatalf("revisions are shared by documents, as a bucket's: %d after %d (%v)", other, rev, err)
	}
	if _, err := st.Put(ctx, "current", current{2}, rev); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, "current", &v); err != nil || v.Version != 2 {
		t.Fatalf("get: %v %v", v, err)
	}
	if _, err := st.Put(ctx, "not.a.key", current{}, 0); err == nil {
		t.Fatal("a name that is not a key was accepted")
	}
}

// TestAssertionsFailOnAWrongExpectation proves every assertion reports a
// wrong expectation, and passes a right one.
func TestAssertionsFailOnAWrongExpectation(t *testing.T) {
	// Each check replays the stream with the fake TB, so what the helper
	// reports lands there.
	stream := []event.Event{rotation(t, 1, "c1"), rotation(t, 2, "c2")}
	replay := func(tb testing.TB) *workertest.Result {
		h := &versions{}
		return workertest.Replay(tb, stream, spec(h), h)
	}
	res := replay(t)
	cases := []struct {
		name        string
		right       func(tb testing.TB)
		wrong       func(tb testing.TB)
		wrongSaysAt []string
	}{
		{"verdicts",
			func(tb testing.TB) { replay(tb).AssertVerdicts(workertest.Superseded, workertest.Applied) },
			func(tb testing.TB) { replay(tb).AssertVerdicts(workertest.Applied, workertest.Applied) },
			[]string{"verdicts [superseded applied]", "want [applied applied]"}},
		{"outcomes",
			func(tb testing.TB) { replay(tb).AssertOutcomes("superseded", "applied") },
			func(tb testing.TB) { replay(tb).AssertOutcomes("applied") },
			[]string{"outcomes [superseded applied]"}},
		{"dead letters",
			func(tb testing.TB) { replay(tb).AssertDeadLetters() },
			func(tb testing.TB) { replay(tb).AssertDeadLetters("anything") },
			[]string{"0 dead letters"}},
		{"state",
			func(tb testing.TB) { replay(tb).AssertState("current", current{2}) },
			func(tb testing.TB) { replay(tb).AssertState("current", current{1}) },
			[]string{`state current is {"version":2}`, `want {"version":1}`}},
		{"missing state",
			func(tb testing.TB) { replay(tb).AssertState("current", map[string]any{"version": 2}) },
			func(tb testing.TB) { replay(tb).AssertState("floor", current{1}) },
			[]string{`no state document "floor"`}},
		{"stages",
			func(tb testing.TB) { replay(tb).AssertStages(map[string]int{"writing": 2}) },
			func(tb testing.TB) { replay(tb).AssertStages(map[string]int{"writing": 1}) },
			[]string{`stage 0 is {"writing":2}`}},
		{"outcome",
			func(tb testing.TB) { replay(tb).Outcome("applied") },
			func(tb testing.TB) { replay(tb).Outcome("refused") },
			[]string{"no refused outcome among [superseded applied]"}},
		{"outcome data",
			func(tb testing.TB) { workertest.OutcomeAs[map[string]uint64](replay(tb), "applied") },
			func(tb testing.TB) { workertest.OutcomeAs[[]string](replay(tb), "applied") },
			[]string{"does not decode as []string"}},
		{"state data",
			func(tb testing.TB) { workertest.StateAs[current](replay(tb), "current") },
			func(tb testing.TB) { workertest.StateAs[current](replay(tb), "none") },
			[]string{`no state document "none"`}},
		{"typed outcome of a stream",
			func(tb testing.TB) {
				workertest.DataAs[map[string]uint64](tb, res.Outcomes[1], events.OutcomeType("demo", "applied"))
			},
			func(tb testing.TB) {
				workertest.DataAs[map[string]uint64](tb, res.Outcomes[1], events.OutcomeType("demo", "refused"))
			},
			[]string{"want dev.steward.demo.refused.v1"}},
	}
	for _, c := range cases {
		mustPass(t, c.name, c.right)
		mustFail(t, c.name, c.wrong, c.wrongSaysAt...)
	}
	// A failed Outcome stops the test, as t.Fatal does.
	if f := run(t, func(tb testing.TB) { replay(tb).Outcome("refused") }); !f.fatal {
		t.Fatal("Outcome of a missing outcome did not stop the test")
	}
}

// TestReplayFileOnTheRealRuntimeAgreesWithMemory runs the same recorded
// stream in memory and through the runtime on an embedded server.
func TestReplayFileOnTheRealRuntimeAgreesWithMemory(t *testing.T) {
	path := writeStream(t, rotation(t, 1, "c1"), rotation(t, 3, "c3"), rotation(t, 2, "c2"))
	mem := workertest.ReplayFile(t, path, spec(&versions{}), &versions{})
	real := workertest.ReplayFile(t, path, spec(&versions{}), &versions{}, workertest.WithRuntime(), workertest.WithLogger(zerolog.New(zerolog.NewTestWriter(t))))
	for _, res := range []*workertest.Result{mem, real} {
		res.AssertVerdicts(workertest.Superseded, workertest.Applied, workertest.Refused)
		res.AssertOutcomes("superseded", "applied", "skipped")
		res.AssertDeadLetters()
		res.AssertState("current", current{3})
	}
	for i := range mem.Outcomes {
		if mem.Outcomes[i].ID() != real.Outcomes[i].ID() || mem.Outcomes[i].Type() != real.Outcomes[i].Type() {
			t.Errorf("outcome %d: %s %s in memory, %s %s on the runtime", i, mem.Outcomes[i].ID(), mem.Outcomes[i].Type(), real.Outcomes[i].ID(), real.Outcomes[i].Type())
		}
	}
}

// TestUncheckedHandsTheHandlerWhatValidationRefuses runs a rotation whose
// data the schema refuses (a version of 0 breaks its minimum, a field it
// does not know) once as the runtime would, dead-lettered unhandled, and
// once Unchecked: the handler then sees it, and what it does lands in the
// Result as usual.
func TestUncheckedHandsTheHandlerWhatValidationRefuses(t *testing.T) {
	bad := func() event.Event {
		e := event.New()
		e.SetID("rot-bad")
		e.SetSource("/test")
		e.SetType(events.TypeCredentialRotated)
		e.SetSubject("h1")
		if err := e.SetData(events.ContentTypeJSON, map[string]any{"hive": "h1", "version": 0, "clientId": "c0", "secret": "x", "extra": true}); err != nil {
			t.Fatal(err)
		}
		return e
	}
	h := &versions{}
	checked := workertest.Work(t, spec(h), h, bad())
	checked.AssertVerdicts(workertest.DeadLettered)
	if len(h.ran) != 0 {
		t.Fatalf("the handler ran on data the schema refuses: %v", h.ran)
	}
	unchecked := workertest.Work(t, spec(h), workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		return d.Emit(ctx, "seen", map[string]string{"id": d.Event.ID()})
	}), bad(), workertest.Unchecked())
	unchecked.AssertVerdicts(workertest.Applied)
	unchecked.AssertOutcomes("seen")
}

// flaky fails its first failures calls with a transient error, then runs
// the versions handler.
type flaky struct {
	mu       sync.Mutex
	failures int
	v        versions
}

func (f *flaky) Handle(ctx context.Context, d *workers.Delivery) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures > 0 {
		f.failures--
		return errors.New("the vault is not reachable yet")
	}
	return f.v.Handle(ctx, d)
}

// TestWithAttemptsAppliesATransientFailureOnceItPasses runs a handler that
// fails twice and then applies, in memory and on the runtime: with three
// attempts it is applied at the third, with the default one it is reported
// retried at its first failure.
func TestWithAttemptsAppliesATransientFailureOnceItPasses(t *testing.T) {
	path := writeStream(t, rotation(t, 1, "c1"))
	fast := workers.WithMaxBackoff(10 * time.Millisecond)
	for _, where := range []struct {
		name string
		opts []workertest.Option
	}{{"memory", nil}, {"runtime", []workertest.Option{workertest.WithRuntime(fast)}}} {
		res := workertest.ReplayFile(t, path, spec(nil), &flaky{failures: 2}, append(where.opts, workertest.WithAttempts(3))...)
		res.AssertVerdicts(workertest.Applied)
		res.AssertOutcomes("applied")
		if a := res.Events[0].Attempts; a != 3 {
			t.Errorf("%s: applied after %d attempts, want 3", where.name, a)
		}
		once := workertest.ReplayFile(t, path, spec(nil), &flaky{failures: 2}, where.opts...)
		once.AssertVerdicts(workertest.Retried)
		if a := once.Events[0].Attempts; a != 1 || once.Events[0].Err == nil {
			t.Errorf("%s: without WithAttempts, %d attempts and error %v; want one, failed", where.name, a, once.Events[0].Err)
		}
	}
}

// TestAFailedEventIsTriedAgainAfterOtherKeysRan: an event whose handler
// needs another key's event applied first (as an invitation needs its
// deployment's host floor) fails at its first attempt and applies at its
// second, because the engine in memory tries it again only once every
// other lane has had its turn, as a worker's lanes run on while one backs
// off. With one attempt it is Retried, and the other key applies anyway.
func TestAFailedEventIsTriedAgainAfterOtherKeysRan(t *testing.T) {
	var mu sync.Mutex
	floors := map[string]bool{}
	h := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if d.Key == "floor" {
			floors["deployment"] = true
			return d.Emit(ctx, "applied", map[string]string{"key": d.Key})
		}
		if !floors["deployment"] {
			return errors.New("no host floor for the deployment yet")
		}
		return d.Emit(ctx, "applied", map[string]string{"key": d.Key})
	})
	s := workers.Spec{Name: "demo", Instance: "h1", Subjects: []string{"steward.events.credential.rotated.*"}, Types: []string{events.TypeCredentialRotated}}
	ev := func(key string) event.Event {
		e, err := events.New(events.TypeCredentialRotated, key, rotated{Hive: key, Version: 1, ClientID: "c", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----"})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	twice := workertest.NewRunner(t, s, h, workertest.WithAttempts(2)).WorkAll([]event.Event{ev("box"), ev("floor")})
	twice.AssertVerdicts(workertest.Applied, workertest.Applied)
	if a := twice.Events[0].Attempts; a != 2 {
		t.Fatalf("the waiting event ran %d times, want 2 (failed, then applied)", a)
	}

	floors = map[string]bool{}
	once := workertest.NewRunner(t, s, h).WorkAll([]event.Event{ev("box"), ev("floor")})
	once.AssertVerdicts(workertest.Retried, workertest.Applied)
}
