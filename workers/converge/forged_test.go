package converge

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

// The attacks of issue 12, finding 1: whoever can write
// $KV.STEWARD_CHECKPOINTS.> writes stages and installed-version documents.
// Stored state is a cache, never proof, so none of these may run an image
// nobody signed, record a version nobody installed, or allow a downgrade.

// laneKey is the runtime's checkpoint key of converge's one lane per
// install (kind release-published, order key the install).
const laneKey = "cp." + Name + "." + testInstall + ".release-published." + testInstall

// forgeStage writes stage as the checkpointed stage of the event at seq,
// exactly what an attacker with write access to the bucket can do.
func forgeStage(t *testing.T, js jetstream.JetStream, seq uint64, stage any) {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(stage)
	if err != nil {
		t.Fatal(err)
	}
	// Signed with the instance's own (test) document key: the runtime
	// believes the signature, so what is tested is converge's own check of
	// what the stage claims. A stage nobody signed is not even read
	// (docs/design.md §7; workers' reflection tests).
	store := events.NewStore(kv, events.StoreOptions{Signer: workertest.Signer(events.InfoOf(laneKey).Writer), Verifier: workertest.Verifier()})
	if _, err := store.Set(ctx, laneKey, events.Checkpoint{StageSeq: seq, Stage: raw}); err != nil {
		t.Fatal(err)
	}
}

// seedThenStop starts the worker once, records 1.0.0 installed as its first
// delivery seeds it before any stage, and stops it, so the next event waits
// while its stage is forged.
func seedThenStop(t *testing.T, js jetstream.JetStream, cfg Config) {
	t.Helper()
	_, r := startWorker(t, js, cfg)
	if _, err := r.State().Put(context.Background(), InstalledDoc, Installed{Version: "1.0.0", Seed: true}, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
}

// resumeForged runs an exec worker, seeded at 1.0.0, against a registry
// holding 1.1.0 (signed, converging from minFrom) and a release-published
// 1.1.0 that waits with a forged stage: what forged makes of the release's
// verified evidence and manifest digest. It returns the worker, its
// server's JetStream and the file the exec runner's command writes a
// "version image" line to a run (ranLog reads it).
func resumeForged(t *testing.T, minFrom string, forged func(Evidence, string) any) (*workertest.Running, jetstream.JetStream, string) {
	t.Helper()
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", minFrom))
	good, digest := verifiedRelease(t, reg, key, "1.1.0")
	ran := filepath.Join(t.TempDir(), "ran")
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := execConfig(t, reg, key, `echo "$STEWARD_TARGET_VERSION $STEWARD_IMAGE" >> `+ran)
	seedThenStop(t, js, cfg)
	ack := workertest.PublishData(t, js, events.TypeReleasePublished, "1.1.0", events.ReleasePublished{Version: "1.1.0"})
	forgeStage(t, js, ack.Sequence, forged(good, digest))
	_, r := startWorker(t, js, cfg)
	return r, js, ran
}

// ranLog is what the exec runner's command saw, one "version image" line a
// run.
func ranLog(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// A forged stage at every stage the worker writes, naming an image nobody
// signed (with the 99.0.0, with the event's own version, and with
// evidence signed by another key), is refused: the image never runs and
// nothing is recorded. On the old code each of these ran evil or recorded
// 99.0.0.
func TestForgedStageNeverRunsUnsignedImage(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	other := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	evil := image("evil")
	// Evidence an attacker can make: a manifest naming evil, signed by a
	// key that is not the release key.
	otherReg := t.TempDir()
	forged := manifest("1.1.0", "1.0.0")
	forged.OpsImage = evil
	writeRelease(t, otherReg, other, forged)
	otherEvidence, err := dirRegistry{root: otherReg}.fetch(context.Background(), "1.1.0")
	if err != nil {
		t.Fatal(err)
	}
	_, okSum := verifiedRelease(t, reg, key, "1.1.0")

	type variant struct {
		name     string
		version  string
		digest   string
		evidence *Evidence
		want     string
	}
	variants := []variant{
		{"issue's 99.0.0", "99.0.0", okSum, nil, `is for version "99.0.0", not the event's`},
		{"event's version, unsigned image", "1.1.0", okSum, nil, `names image "` + evil + `" but the signed manifest of 1.1.0 names "` + image("1.1.0") + `"`},
		{"evidence by another key", "1.1.0", "", &otherEvidence, "carries no manifest that verifies (signature:"},
	}
	for _, st := range []string{stageVerified, stageJobEnsured, stageRunning, stageDone} {
		for _, v := range variants {
			t.Run(st+"/"+v.name, func(t *testing.T) {
				ran := filepath.Join(t.TempDir(), "ran")
				srv := workertest.StartServer(t)
				js := srv.JetStream(t)
				cfg := execConfig(t, reg, key, `echo "$STEWARD_TARGET_VERSION $STEWARD_IMAGE" >> `+ran)
				// A first run creates the bucket and consumer, then stops,
				// so the event waits while its stage is forged.
				_, r := startWorker(t, js, cfg)
				if err := r.Stop(); err != nil {
					t.Fatal(err)
				}
				ack := workertest.PublishData(t, js, events.TypeReleasePublished, "1.1.0", events.ReleasePublished{Version: "1.1.0"})
				forgeStage(t, js, ack.Sequence, stage{
					Stage: st, Version: v.version, From: "1.0.0", Image: evil, ManifestDigest: v.digest,
					Execution: "exec-1-forged", Result: &result{Succeeded: true, Condition: "forged"}, Evidence: v.evidence,
				})
				_, r = startWorker(t, js, cfg)
				got := waitOutcomes(t, js, 1)
				ref := outcomeData[Refused](t, got[0], OutcomeRefused)
				if ref.Rule != ruleCheckpoint || !strings.Contains(ref.Reason, v.want) || !strings.Contains(ref.Reason, "nothing ran") {
					t.Fatalf("refused %+v, want rule %s saying %q", ref, ruleCheckpoint, v.want)
				}
				noDeadLetters(t, js, r)
				if log := ranLog(t, ran); log != "" {
					t.Fatalf("the ops job ran: %q", log)
				}
				if got := recorded(t, r); got != "" {
					t.Fatalf("a forged stage recorded installed version %q", got)
				}
			})
		}
	}
}

// A stage forged with the real signed manifest but another starting point
// (claiming 1.1.0 converges from 0.9.0 while 1.0.0 is installed) is
// refused. (A stage whose installed-version document was deleted holds
// instead: TestInstalledDocHoldsWhenTheRunnerCannotRebuildIt.)
func TestForgedStageWithAnotherStartingPointIsRefused(t *testing.T) {
	r, js, ran := resumeForged(t, "0.1.0", func(good Evidence, digest string) any {
		return stage{Stage: stageVerified, Version: "1.1.0", From: "0.9.0", Image: image("1.1.0"), ManifestDigest: digest, Evidence: &good}
	})
	ref := outcomeData[Refused](t, waitOutcomes(t, js, 1)[0], OutcomeRefused)
	const want = `converges from "0.9.0" but the verified installed version is "1.0.0"`
	if !strings.Contains(ref.Reason, want) || !strings.Contains(ref.Reason, "nothing ran") {
		t.Fatalf("refused %+v, want %q", ref, want)
	}
	noDeadLetters(t, js, r)
	if log := ranLog(t, ran); log != "" {
		t.Fatalf("the ops job ran: %q", log)
	}
}

// After a real converge to 1.1.0, an installed-version document deleted or
// forged low (0.5.0, which no signed release backs) is rebuilt from the
// runner's newest succeeded execution, so the downgrade to 1.0.5 is refused
// against 1.1.0: not as a missing document, a bare document as older
// workers wrote them, evidence signed by another key, a seed that differs
// from --installed-version, or not JSON of a document. Both runners: Cloud
// Run's execution list and the exec runner's record. On the old code a
// deleted document let 1.0.5 run, and the others refused it for the wrong
// reason without ever knowing 1.1.0 was installed.
func TestForgedOrDeletedInstalledDocIsRebuiltFromTheRunner(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	other := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	writeRelease(t, reg, key, manifest("1.0.5", "0.1.0"))
	otherReg := t.TempDir()
	writeRelease(t, otherReg, other, manifest("0.5.0", "0.1.0"))
	otherEvidence, err := dirRegistry{root: otherReg}.fetch(context.Background(), "0.5.0")
	if err != nil {
		t.Fatal(err)
	}
	for _, runner := range []string{RunnerCloudRun, RunnerExec} {
		for _, c := range []struct {
			name string
			doc  any // nil: deleted
		}{
			{"deleted", nil},
			{"bare document", map[string]any{"version": "0.5.0", "updatedAt": "2026-03-01T12:00:00Z"}},
			{"evidence by another key", Installed{Version: "0.5.0", Evidence: &otherEvidence}},
			{"seed unlike --installed-version", Installed{Version: "0.5.0", Seed: true}},
			{"not JSON of a document", map[string]any{"version": 7}},
		} {
			t.Run(runner+"/"+c.name, func(t *testing.T) {
				ran := filepath.Join(t.TempDir(), "ran")
				srv := workertest.StartServer(t)
				js := srv.JetStream(t)
				var cfg Config
				var fake *cloudrunfake.Server
				if runner == RunnerExec {
					cfg = execConfig(t, reg, key, `echo "$STEWARD_TARGET_VERSION" >> `+ran)
					cfg.ExecRecordDir = t.TempDir()
				} else {
					fake = cloudrunfake.Start(t)
					cfg = cloudRunConfig(reg, key, fake)
				}
				_, r := startWorker(t, js, cfg)
				publishRelease(t, js, "1.1.0", "")
				first := outcomeData[Succeeded](t, waitOutcomes(t, js, 1)[0], OutcomeSucceeded)
				workertest.WaitIdle(t, js, r.ConsumerName())
				var doc Installed
				rev, err := r.State().Get(context.Background(), InstalledDoc, &doc)
				if err != nil || doc.Evidence == nil || doc.Version != "1.1.0" {
					t.Fatalf("recorded %+v (%v), want 1.1.0 with its evidence", doc, err)
				}
				if c.doc == nil {
					kv, err := js.KeyValue(context.Background(), events.CheckpointBucket)
					if err != nil {
						t.Fatal(err)
					}
					if err := kv.Delete(context.Background(), "st."+Name+"."+testInstall+"."+InstalledDoc); err != nil {
						t.Fatal(err)
					}
				} else if _, err := r.State().Put(context.Background(), InstalledDoc, c.doc, rev); err != nil {
					t.Fatal(err)
				}
				publishRelease(t, js, "1.0.5", "")
				got := waitOutcomes(t, js, 2)
				ref := outcomeData[Refused](t, got[1], OutcomeRefused)
				if ref.Rule != ruleDowngrade || !strings.Contains(ref.Reason, "older than the installed 1.1.0") {
					t.Fatalf("refused %+v, want rule %s against the rebuilt 1.1.0", ref, ruleDowngrade)
				}
				noDeadLetters(t, js, r)
				doc = Installed{}
				if _, err := r.State().Get(context.Background(), InstalledDoc, &doc); err != nil || doc.Version != "1.1.0" || doc.Execution != first.Execution || doc.Evidence == nil {
					t.Fatalf("rebuilt %+v (%v), want 1.1.0 from execution %s with evidence", doc, err, first.Execution)
				}
				if _, _, err := verifyEvidence(newReleaseKeys(mustKey(t, key)), "1.1.0", *doc.Evidence); err != nil {
					t.Fatalf("rebuilt evidence does not verify: %v", err)
				}
				if runner == RunnerExec {
					if log := ranLog(t, ran); log != "1.1.0\n" {
						t.Fatalf("the ops job ran for %q, want 1.1.0 only", log)
					}
				} else if n := len(fake.RunRequests()); n != 1 {
					t.Fatalf("%d RunJob requests, want 1", n)
				}
			})
		}
	}
}

// A stage an older worker saved without evidence still resumes, verified
// from the registry's signed release.
func TestLegacyStageIsVerifiedFromTheRegistry(t *testing.T) {
	r, js, ran := resumeForged(t, "1.0.0", func(_ Evidence, digest string) any {
		return map[string]any{"stage": stageVerified, "version": "1.1.0", "from": "1.0.0", "image": image("1.1.0"), "manifestDigest": digest, "marker": "an older worker's"}
	})
	s := outcomeData[Succeeded](t, waitOutcomes(t, js, 1)[0], OutcomeSucceeded)
	if s.From != "1.0.0" || s.To != "1.1.0" {
		t.Fatalf("succeeded %+v", s)
	}
	if log := ranLog(t, ran); log != "1.1.0 "+image("1.1.0")+"\n" {
		t.Fatalf("ran %q", log)
	}
	var doc Installed
	if _, err := r.State().Get(context.Background(), InstalledDoc, &doc); err != nil || doc.Version != "1.1.0" || doc.Evidence == nil {
		t.Fatalf("recorded %+v (%v), want 1.1.0 with evidence", doc, err)
	}
}
