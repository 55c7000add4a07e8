package converge

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/run/apiv2/runpb"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

// The rules of issue 23: a stage's claim about the outside world is
// checked with the outside world, executions are found by their event
// before anything starts, and the installed version is rebuilt from the
// runner rather than read as absent.

// stewardExecution is an execution of the test install's job as Steward's
// template labels it, for cloudrunfake.PutExecution.
func stewardExecution(id, eventID, version, img string) *runpb.Execution {
	return &runpb.Execution{
		Name:        testJobName + "/executions/" + id,
		Labels:      map[string]string{LabelInstall: testInstall, LabelVersion: labelValue(version), LabelManagedBy: "steward", LabelEvent: labelValue(eventID)},
		Annotations: map[string]string{AnnotationEvent: eventID, AnnotationVersion: version},
		Template:    &runpb.TaskTemplate{Containers: []*runpb.Container{{Name: OpsContainer, Image: img}}},
	}
}

// publishAt publishes release.published for version with the event id id
// and returns its stream sequence, for forgeStage.
func publishAt(t *testing.T, js jetstream.JetStream, id, version string) uint64 {
	t.Helper()
	e, err := events.New(events.TypeReleasePublished, version, events.ReleasePublished{Version: version})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID(id)
	return workertest.Publish(t, js, e).Sequence
}

// signedStage is the done stage an attacker makes for 1.1.0 from what the
// registry holds: the genuinely signed manifest and its signature, the
// right image and digest, and a claim that execution succeeded.
func signedStage(t *testing.T, reg string, key keyPair, execution string) stage {
	t.Helper()
	good, digest := verifiedRelease(t, reg, key, "1.1.0")
	return stage{Stage: stageDone, Version: "1.1.0", From: "1.0.0", Image: image("1.1.0"), ManifestDigest: digest,
		Execution: execution, Result: &result{Succeeded: true}, Evidence: &good}
}

// A done stage carrying a genuinely signed manifest, claiming success for
// an execution the runner does not vouch for, moves nothing: the stage is
// discarded and the real release still converges, its job run exactly once.
// One the runner vouches for as this event's and failed, or as this event's
// with another image, is reported failed and nothing runs. On the old code
// every one of these recorded 1.1.0 without a single RunJob.
func TestForgedDoneStageIsCheckedWithTheRunner(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	const eventID = "release-1.1.0"
	otherJob := "projects/" + testProject + "/locations/" + testRegion + "/jobs/other-ops"
	for _, c := range []struct {
		name      string
		execution string
		put       func(t *testing.T, fake *cloudrunfake.Server)
		// converges: the stage is discarded and the release runs once;
		// else failed says the condition reported, nothing run.
		converges bool
		failed    string
	}{
		{name: "never ran", execution: testJobName + "/executions/shop-ops-forged", converges: true},
		{name: "another job's", execution: otherJob + "/executions/other-ops-1", converges: true, put: func(t *testing.T, fake *cloudrunfake.Server) {
			x := stewardExecution("x", eventID, "1.1.0", image("1.1.0"))
			x.Name = otherJob + "/executions/other-ops-1"
			if err := fake.PutExecution(x, cloudrunfake.Succeed); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "another event's, failed", execution: testJobName + "/executions/shop-ops-old", converges: true, put: func(t *testing.T, fake *cloudrunfake.Server) {
			if err := fake.PutExecution(stewardExecution("shop-ops-old", "release-1.1.0-first", "1.1.0", image("1.1.0")), cloudrunfake.Fail); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "another event's, another image", execution: testJobName + "/executions/shop-ops-old", converges: true, put: func(t *testing.T, fake *cloudrunfake.Server) {
			if err := fake.PutExecution(stewardExecution("shop-ops-old", "release-1.0.5", "1.0.5", image("1.0.5")), cloudrunfake.Succeed); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "this event's, failed", execution: testJobName + "/executions/shop-ops-1", failed: "Completed=FAILED (NON_ZERO_EXIT_CODE): " + cloudrunfake.FailureMessage, put: func(t *testing.T, fake *cloudrunfake.Server) {
			if err := fake.PutExecution(stewardExecution("shop-ops-1", eventID, "1.1.0", image("1.1.0")), cloudrunfake.Fail); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "this event's, another image", execution: testJobName + "/executions/shop-ops-1", failed: `ran image "` + image("evil") + `", not release 1.1.0's signed`, put: func(t *testing.T, fake *cloudrunfake.Server) {
			if err := fake.PutExecution(stewardExecution("shop-ops-1", eventID, "1.1.0", image("evil")), cloudrunfake.Succeed); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := cloudrunfake.Start(t)
			fake.PutJob(&runpb.Job{Name: testJobName})
			fake.PutJob(&runpb.Job{Name: otherJob})
			if c.put != nil {
				c.put(t, fake)
			}
			srv := workertest.StartServer(t)
			js := srv.JetStream(t)
			cfg := cloudRunConfig(reg, key, fake)
			seedThenStop(t, js, cfg)
			seq := publishAt(t, js, eventID, "1.1.0")
			forgeStage(t, js, seq, signedStage(t, reg, key, c.execution))
			_, r := startWorker(t, js, cfg)
			got := waitOutcomes(t, js, 1)
			noDeadLetters(t, js, r)
			runs := fake.RunRequests()
			if !c.converges {
				f := outcomeData[Failed](t, got[0], OutcomeFailed)
				if f.Execution != c.execution || !strings.Contains(f.Condition, c.failed) {
					t.Fatalf("failed %+v, want execution %s saying %q", f, c.execution, c.failed)
				}
				if len(runs) != 0 {
					t.Fatalf("%d RunJob requests, want none: the event's execution ran already", len(runs))
				}
				if v := recorded(t, r); v != "" {
					t.Fatalf("recorded installed version %q", v)
				}
				return
			}
			s := outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
			if len(runs) != 1 {
				t.Fatalf("%d RunJob requests, want the real release's one", len(runs))
			}
			real := fake.Executions()[len(fake.Executions())-1]
			if s.Execution != real || s.Execution == c.execution {
				t.Fatalf("succeeded %+v, want execution %s (not the forged %s)", s, real, c.execution)
			}
			var doc Installed
			if _, err := r.State().Get(context.Background(), InstalledDoc, &doc); err != nil || doc.Version != "1.1.0" || doc.Execution != real {
				t.Fatalf("recorded %+v (%v), want 1.1.0 from %s", doc, err, real)
			}
			// The real release's own event, published next, is the
			// same version and changes nothing more.
			publishRelease(t, js, "1.1.0", "")
			ref := outcomeData[Refused](t, waitOutcomes(t, js, 2)[1], OutcomeRefused)
			if ref.Rule != ruleSameVersion || len(fake.RunRequests()) != 1 {
				t.Fatalf("again: refused %+v after %d RunJob requests", ref, len(fake.RunRequests()))
			}
		})
	}
}

// A redelivery whose stage is gone (removed from the bucket while the
// execution ran) finds the execution by its event label and watches it:
// Cloud Run sees one RunJob. On the old code it started a second.
func TestRedeliveryWithoutStageWatchesTheEventsExecution(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	fake.SetFate(cloudrunfake.Running)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := cloudRunConfig(reg, key, fake)
	opts := []workers.Option{workers.WithShutdownGrace(50 * time.Millisecond)}
	_, r := startWorker(t, js, cfg, opts...)
	seq := publishAt(t, js, "release-1.1.0", "1.1.0")
	var execution string
	workertest.WaitUntil(t, "the worker watches a running execution", func() bool {
		if e := fake.Executions(); len(e) == 1 {
			execution = e[0]
			return fake.Polls(execution) >= 2
		}
		return false
	})
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	forgeStage(t, js, seq, nil)
	polled := fake.Polls(execution)

	_, r = startWorker(t, js, cfg, opts...)
	workertest.WaitUntil(t, "the redelivery watches the same execution", func() bool {
		return fake.Polls(execution) >= polled+2
	})
	if err := fake.Finish(execution, cloudrunfake.Succeed); err != nil {
		t.Fatal(err)
	}
	s := outcomeData[Succeeded](t, waitOutcomes(t, js, 1)[0], OutcomeSucceeded)
	if s.Execution != execution || s.To != "1.1.0" {
		t.Fatalf("succeeded %+v, want %s", s, execution)
	}
	if e := fake.Executions(); len(e) != 1 || len(fake.RunRequests()) != 1 {
		t.Fatalf("executions %v after %d RunJob requests, want only %s", e, len(fake.RunRequests()), execution)
	}
	if v := recorded(t, r); v != "1.1.0" {
		t.Fatalf("installed version %q", v)
	}
}

// When the installed-version document is missing or not believed and the
// runner's newest succeeded execution has no signed evidence (it ran
// another image than its version's signed one, or its version has no
// signed release), the worker holds: a retry, not a refusal, naming the
// re-seed; nothing runs and nothing is written. Following the re-seed then
// converges. The exec runner without a record holds the same way for a
// document it cannot believe. On the old code the missing document read as
// --installed-version and 1.2.0 ran; the bare one was believed.
func TestInstalledDocHoldsWhenTheRunnerCannotRebuildIt(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	writeRelease(t, reg, key, manifest("1.2.0", "1.0.0"))
	for _, c := range []struct {
		name   string
		runner string
		put    *runpb.Execution
		doc    any // nil: missing
		want   string
	}{
		{"ran another image", RunnerCloudRun, stewardExecution("shop-ops-7", "release-1.1.0", "1.1.0", image("evil")), nil,
			`is missing, and its newest succeeded execution ` + testJobName + `/executions/shop-ops-7, labelled 1.1.0, ran image "` + image("evil") + `"`},
		{"unsigned version", RunnerCloudRun, stewardExecution("shop-ops-7", "release-1.3.0", "1.3.0", image("1.3.0")), Installed{Version: "1.3.0"},
			"records 1.3.0 without signed evidence and is no seed, so it is not believed, and release 1.3.0, which its newest succeeded execution " + testJobName + "/executions/shop-ops-7 ran, has no verifiable release in the registry"},
		{"exec without a record", RunnerExec, nil, map[string]any{"version": "1.1.0", "from": "1.0.0", "execution": "exec-1-1", "eventId": "old"},
			"records 1.1.0 without signed evidence and is no seed, so it is not believed, and the exec runner keeps no record of its executions to rebuild it from (set --exec-record-dir so it does)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake := cloudrunfake.Start(t)
			fake.PutJob(&runpb.Job{Name: testJobName})
			if c.put != nil {
				if err := fake.PutExecution(c.put, cloudrunfake.Succeed); err != nil {
					t.Fatal(err)
				}
			}
			cfg := cloudRunConfig(reg, key, fake)
			if c.runner == RunnerExec {
				cfg = execConfig(t, reg, key, "true")
			}
			w, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			r := workertest.NewRunner(t, w.Spec(), w)
			if c.doc != nil {
				if _, err := r.State().Put(context.Background(), InstalledDoc, c.doc, 0); err != nil {
					t.Fatal(err)
				}
			}
			before, err := r.State().Documents(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			e, err := events.New(events.TypeReleasePublished, "1.2.0", events.ReleasePublished{Version: "1.2.0"})
			if err != nil {
				t.Fatal(err)
			}
			e.SetID("release-1.2.0")
			res := r.Work(e)
			res.AssertVerdicts(workertest.Retried)
			msg := res.Err().Error()
			for _, want := range []string{c.want, "this release is held (retried, not refused) and nothing ran",
				"--installed-version <version> --reseed", "STEWARD_RESEED=true",
				"converge shop, event release-1.2.0"} {
				if !strings.Contains(msg, want) {
					t.Fatalf("error %q does not say %q", msg, want)
				}
			}
			res.AssertOutcomes()
			if n := len(fake.RunRequests()); n != 0 {
				t.Fatalf("%d RunJob requests while held", n)
			}
			if after := res.State; len(after) != len(before) || string(after[InstalledDoc]) != string(before[InstalledDoc]) {
				t.Fatalf("state changed while held: %s, was %s", after[InstalledDoc], before[InstalledDoc])
			}

			// The re-seed it names: --installed-version with --reseed
			// over the same state; the release then converges from it.
			cfg.InstalledVersion, cfg.Reseed = "1.1.0", true
			w2, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer w2.Close()
			r2 := workertest.NewRunner(t, w2.Spec(), w2)
			docs, err := r.State().Documents(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for name, raw := range docs {
				if _, err := r2.State().Put(context.Background(), strings.TrimPrefix(name, "st.converge.shop."), json.RawMessage(raw), 0); err != nil {
					t.Fatal(err)
				}
			}
			res = r2.Work(e)
			res.AssertVerdicts(workertest.Applied)
			if s := outcomeData[Succeeded](t, res.Outcomes[0], OutcomeSucceeded); s.From != "1.1.0" || s.To != "1.2.0" {
				t.Fatalf("after the re-seed: %+v", s)
			}
		})
	}
}

// The exec runner with --exec-record-dir keeps the rules as Cloud Run
// does: a done stage naming a command it never ran is discarded and the
// release runs once, and a redelivery with no stage finds the event's
// record instead of running the command again.
func TestExecRecordChecksStagesAndFindsTheEvent(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	ran := t.TempDir() + "/ran"
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := execConfig(t, reg, key, `echo "$STEWARD_TARGET_VERSION" >> `+ran)
	cfg.ExecRecordDir = t.TempDir()
	seedThenStop(t, js, cfg)
	seq := publishAt(t, js, "release-1.1.0", "1.1.0")
	forgeStage(t, js, seq, signedStage(t, reg, key, "exec-1-forged"))
	_, r := startWorker(t, js, cfg)
	s := outcomeData[Succeeded](t, waitOutcomes(t, js, 1)[0], OutcomeSucceeded)
	if s.Execution == "exec-1-forged" || ranLog(t, ran) != "1.1.0\n" {
		t.Fatalf("succeeded %+v after the command ran %q, want one real run", s, ranLog(t, ran))
	}
	noDeadLetters(t, js, r)

	// The same event delivered again with its stage gone (the runtime's
	// checkpoint forged back to "not applied, no stage"): the record of
	// its execution is found and nothing runs again.
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e, err := events.New(events.TypeReleasePublished, "1.1.0", events.ReleasePublished{Version: "1.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	e.SetID("release-1.1.0")
	mem := workertest.NewRunner(t, w.Spec(), w)
	if _, err := mem.State().Put(context.Background(), InstalledDoc, Installed{Version: "1.0.0", Seed: true}, 0); err != nil {
		t.Fatal(err)
	}
	res := mem.Work(e)
	res.AssertVerdicts(workertest.Applied)
	if again := outcomeData[Succeeded](t, res.Outcomes[0], OutcomeSucceeded); again.Execution != s.Execution {
		t.Fatalf("redelivery succeeded with %+v, want the recorded %s", again, s.Execution)
	}
	if log := ranLog(t, ran); log != "1.1.0\n" {
		t.Fatalf("the command ran %q, want once", log)
	}
}
