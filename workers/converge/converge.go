// Package converge is the converge worker: when a release is published, it
// decides whether its install may move to that release and, if so, runs the
// install's ops job for exactly that release.
//
// The event names a version only. What runs is read from the registry the
// worker is configured with and trusted only if its manifest verifies
// against the release key, so whoever can publish events can at most make
// an install move to a newer signed release. Progress is checkpointed in
// stages (verified, job-ensured, running, done) so a redelivery after a
// crash watches the execution it started instead of starting another, and
// the installed version is recorded only after the ops job succeeded.
package converge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers"
)

// Name is the worker's name: its consumer is converge-<install> and its
// outcomes are dev.steward.converge.<outcome>.v1.
const Name = "converge"

// The outcomes the worker emits.
const (
	OutcomeSucceeded = "succeeded"
	OutcomeRefused   = "refused"
	OutcomeFailed    = "failed"
)

// InstalledDoc is the name of the worker state document holding the
// installed version.
const InstalledDoc = "installed"

// Installed is the installed-version document. After a successful converge
// it carries the signed manifest of the version it records (Evidence), and
// the worker believes it only as far as that evidence verifies: the
// document sits in a bucket others can write, so on its own it proves
// nothing. Before the first converge the worker writes the seed form (Seed,
// no Evidence), which is believed only while it equals --installed-version.
type Installed struct {
	Version   string    `json:"version"`
	From      string    `json:"from,omitempty"`
	Execution string    `json:"execution,omitempty"`
	EventID   string    `json:"eventId,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
	// Seed marks the document the worker writes from --installed-version
	// before its first converge, so that a stage saved after it always
	// finds an installed-version document and a missing one is refused.
	Seed bool `json:"seed,omitempty"`
	// Evidence is the signed manifest of Version, as the converge that
	// recorded it verified it.
	Evidence *Evidence `json:"evidence,omitempty"`
}

// Succeeded is the data of a converge.succeeded outcome.
type Succeeded struct {
	Install   string `json:"install"`
	From      string `json:"from"`
	To        string `json:"to"`
	Execution string `json:"execution"`
}

// Refused is the data of a converge.refused outcome: the rule the release
// broke and the reason, in words an operator acts on.
type Refused struct {
	Install string `json:"install"`
	Version string `json:"version"`
	Rule    string `json:"rule"`
	Reason  string `json:"reason"`
}

// Failed is the data of a converge.failed outcome: the execution that ran
// (empty if none could start) and how it ended.
type Failed struct {
	Install   string `json:"install"`
	Version   string `json:"version"`
	Execution string `json:"execution"`
	Condition string `json:"condition"`
}

// The stages of one converge, checkpointed in order.
const (
	stageVerified    = "verified"
	stageJobEnsured  = "job-ensured"
	stageRunning     = "running"
	stageDone        = "done"
	maxRecordRetries = 5
)

// stage is the checkpointed progress of one release.published. Like any
// stored state it is a cache, never proof: a resumed stage is verified
// again from Evidence (recheck) before anything runs.
type stage struct {
	Stage          string  `json:"stage"`
	Version        string  `json:"version"`
	From           string  `json:"from"`
	Image          string  `json:"image"`
	ManifestDigest string  `json:"manifestDigest"`
	Marker         string  `json:"marker,omitempty"`
	Execution      string  `json:"execution,omitempty"`
	Result         *result `json:"result,omitempty"`
	// Evidence is the signed manifest the stage was verified from. A
	// stage an older worker saved has none; its release is then read and
	// verified from the registry again.
	Evidence *Evidence `json:"evidence,omitempty"`
}

// Worker converges one install.
type Worker struct {
	cfg *checked
	run runner
	now func() time.Time
}

// New checks cfg and builds the worker with its runner. With the cloudrun
// runner it opens the Cloud Run clients (Application Default Credentials,
// or the plaintext test endpoint).
func New(cfg Config) (*Worker, error) {
	c, err := cfg.check()
	if err != nil {
		return nil, fmt.Errorf("converge: %w", err)
	}
	w := &Worker{cfg: c, now: time.Now}
	switch c.Runner {
	case RunnerExec:
		w.run = newExec(c)
	case RunnerCloudRun:
		if w.run, err = newCloudRun(context.Background(), c); err != nil {
			return nil, fmt.Errorf("converge: %w", err)
		}
	}
	return w, nil
}

// Spec consumes every release.published, one at a time in stream order for
// the whole install: releases are ordered by the install, not by their
// version, so they share one checkpoint and never run side by side.
func (w *Worker) Spec() workers.Spec {
	k, _ := events.Lookup(events.TypeReleasePublished)
	install := w.cfg.Install
	return workers.Spec{
		Name:     Name,
		Instance: install,
		Subjects: []string{k.FilterSubject("")},
		Types:    []string{events.TypeReleasePublished},
		OrderKey: func(event.Event) string { return install },
	}
}

// Close closes the runner's clients.
func (w *Worker) Close() error { return w.run.close() }

// Handle converges the install to one published release, resuming from the
// stage an earlier delivery of the same event saved once that stage is
// verified again from signed material.
func (w *Worker) Handle(ctx context.Context, d *workers.Delivery) error {
	var ev events.ReleasePublished
	if err := d.DataAs(&ev); err != nil {
		return err
	}
	var st stage
	resumed, err := d.LoadStage(&st)
	if err != nil {
		return w.wrap(d, err)
	}
	if !resumed || st.Stage == "" {
		rel, evd, inst, err := w.verify(ctx, d, ev)
		if err != nil {
			return err
		}
		if inst.rev == 0 {
			// From here on the install has state: a stage that finds no
			// installed-version document was tampered with.
			if err := w.seed(ctx, d, inst.version); err != nil {
				return w.wrap(d, err)
			}
		}
		st = stage{Stage: stageVerified, Version: rel.Version, From: rel.From, Image: rel.Image, ManifestDigest: rel.ManifestDigest, Evidence: &evd}
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
		d.Log.Info().Str("version", rel.Version).Str("from", rel.From).Str("image", rel.Image).Msg("release verified")
	} else if err := w.recheck(ctx, d, ev, &st); err != nil {
		return err
	}
	rel := release{Install: w.cfg.Install, Version: st.Version, From: st.From, Image: st.Image, ManifestDigest: st.ManifestDigest, logger: d.Log}
	if st.Stage == stageVerified {
		marker, err := w.run.ensure(ctx, rel)
		if err != nil {
			return w.runnerError(ctx, d, rel, err)
		}
		st.Stage, st.Marker = stageJobEnsured, marker
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
	}
	if st.Stage == stageJobEnsured {
		execution, err := w.run.start(ctx, rel, st.Marker)
		if err != nil {
			return w.runnerError(ctx, d, rel, err)
		}
		// From here on a redelivery watches this execution; it never
		// starts another.
		st.Stage, st.Execution = stageRunning, execution
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
		d.Log.Info().Str("execution", execution).Msg("ops job running")
	}
	if st.Stage == stageRunning {
		res, err := w.run.watch(ctx, rel, st.Execution)
		if err != nil {
			return w.wrap(d, err)
		}
		st.Stage, st.Result = stageDone, &res
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
	}
	if st.Stage != stageDone || st.Result == nil {
		return workers.Permanent(w.wrap(d, fmt.Errorf("checkpointed stage %q is not one this worker writes", st.Stage)))
	}
	return w.finish(ctx, d, st)
}

func (w *Worker) wrap(d *workers.Delivery, err error) error {
	return fmt.Errorf("converge %s, event %s: %w", w.cfg.Install, d.Event.ID(), err)
}

// verify reads the installed version and the release, and refuses what the
// install may not move to.
func (w *Worker) verify(ctx context.Context, d *workers.Delivery, ev events.ReleasePublished) (release, Evidence, installedState, error) {
	// The schema already refused a version that is not semver; checked
	// again here because the version is about to become a path or URL.
	if err := events.CheckVersion(ev.Version); err != nil {
		return release{}, Evidence{}, installedState{}, w.refused(ctx, d, ev.Version, refuse(ruleVersionFormat, "%v, so it names no release in the registry and nothing ran", err))
	}
	inst, err := w.installed(ctx, d, false)
	if err != nil {
		return release{}, Evidence{}, installedState{}, w.refusedOr(ctx, d, ev.Version, err)
	}
	rel, evd, err := w.fetchRelease(ctx, ev, inst.version)
	if err != nil {
		return release{}, Evidence{}, installedState{}, w.refusedOr(ctx, d, ev.Version, err)
	}
	return rel, evd, inst, nil
}

// recheck verifies a resumed stage again before anything acts on it: the
// stage's evidence (or, for a stage an older worker saved without any, the
// registry's release) must verify against the release key and name exactly
// the stage's version, image and digest, the event's version, and a move
// the verified installed version allows. A stage that fails is refused, so
// a forged checkpoint never runs an image nobody signed.
func (w *Worker) recheck(ctx context.Context, d *workers.Delivery, ev events.ReleasePublished, st *stage) error {
	switch st.Stage {
	case stageVerified, stageJobEnsured, stageRunning, stageDone:
	default:
		return workers.Permanent(w.wrap(d, fmt.Errorf("checkpointed stage %q is not one this worker writes, so nothing ran", st.Stage)))
	}
	bad := func(format string, args ...any) error {
		return w.refused(ctx, d, ev.Version, refuse(ruleCheckpoint, "the checkpointed stage %q of release %s "+format, append([]any{st.Stage, ev.Version}, args...)...))
	}
	if err := events.CheckVersion(ev.Version); err != nil {
		return w.refused(ctx, d, ev.Version, refuse(ruleVersionFormat, "%v, so it names no release in the registry and nothing ran", err))
	}
	if st.Version != ev.Version {
		return bad("is for version %q, not the event's; a stage is only good for its own event, so nothing ran", st.Version)
	}
	var evd Evidence
	if st.Evidence != nil {
		evd = *st.Evidence
	} else {
		// A stage saved before stages kept their evidence: read the
		// release again, so it is verified all the same.
		fetched, err := w.cfg.registry.fetch(ctx, ev.Version)
		if err != nil {
			return w.refusedOr(ctx, d, ev.Version, err)
		}
		evd = fetched
	}
	m, digest, err := verifyEvidence(w.cfg.keys, ev.Version, evd)
	if err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return bad("carries no manifest that verifies (%s: %s)", r.rule, r.reason)
		}
		return w.wrap(d, err)
	}
	if st.Image != m.OpsImage {
		return bad("names image %q but the signed manifest of %s names %q; only the signed image runs, so nothing ran", st.Image, ev.Version, m.OpsImage)
	}
	if st.ManifestDigest != digest {
		return bad("names manifest digest %q but its signed manifest is %s, so nothing ran", st.ManifestDigest, digest)
	}
	inst, err := w.installed(ctx, d, true)
	if err != nil {
		return w.refusedOr(ctx, d, ev.Version, err)
	}
	recorded := st.Stage == stageDone && st.Result != nil && st.Result.Succeeded &&
		inst.version == st.Version && inst.doc.EventID == d.Event.ID()
	if inst.version != st.From && !recorded {
		return bad("converges from %q but the verified installed version is %q, so nothing ran", st.From, inst.version)
	}
	if err := checkRelease(m, digest, ev, st.From); err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return bad("is not a move the signed manifest allows (%s: %s)", r.rule, r.reason)
		}
		return w.wrap(d, err)
	}
	st.Evidence = &evd
	return nil
}

// installedState is the installed version as far as it was verified.
type installedState struct {
	version string
	// rev is the document's revision; 0 when there is none yet and the
	// version is --installed-version's.
	rev uint64
	doc Installed
}

// installed returns the installed version, verified: a document carrying
// evidence is believed as far as its signed manifest verifies and names
// its version; the seed form only while it equals --installed-version; a
// document an older worker wrote (no evidence, no seed mark) only when the
// registry still holds a signed manifest for its version. With no document
// at all, --installed-version stands in, but only for a first start: once
// the install has state (resumed is a stage saved for this event), a
// missing document is refused. Nothing is written here, so a refusal
// records nothing. Every "no" is a *refusal.
func (w *Worker) installed(ctx context.Context, d *workers.Delivery, resumed bool) (installedState, error) {
	var doc Installed
	rev, err := d.State().Get(ctx, InstalledDoc, &doc)
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	if errors.As(err, &syntax) || errors.As(err, &typ) {
		return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s is not readable (%v), so the installed version is unknown and nothing ran; %s", w.cfg.Install, err, w.reseed())
	}
	if err != nil {
		return installedState{}, err
	}
	if rev == 0 {
		if resumed {
			return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s is missing although this release has a checkpointed stage, so it was removed and --installed-version is not taken in its place; nothing ran; %s", w.cfg.Install, w.reseed())
		}
		if w.cfg.InstalledVersion == "" {
			return installedState{}, refuse(ruleInstalledUnknown, "the installed version of %s is unknown (nothing recorded and no --installed-version), so no release can be checked against it and nothing ran; set --installed-version to what the install runs", w.cfg.Install)
		}
		return installedState{version: w.cfg.InstalledVersion}, nil
	}
	st := installedState{version: doc.Version, rev: rev, doc: doc}
	if err := events.CheckVersion(doc.Version); err != nil {
		return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s records %q: %v, so nothing ran; %s", w.cfg.Install, doc.Version, err, w.reseed())
	}
	switch {
	case doc.Evidence != nil:
		if _, _, err := verifyEvidence(w.cfg.keys, doc.Version, *doc.Evidence); err != nil {
			var r *refusal
			if errors.As(err, &r) {
				return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s records %s but its evidence does not verify (%s: %s), so it is not believed and nothing ran; %s", w.cfg.Install, doc.Version, r.rule, r.reason, w.reseed())
			}
			return installedState{}, err
		}
	case doc.Seed:
		if doc.Version != w.cfg.InstalledVersion {
			return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s is a seed for %s carrying no signed evidence, and --installed-version is %q; an unsigned seed is believed only while it equals --installed-version, so nothing ran; %s", w.cfg.Install, doc.Version, w.cfg.InstalledVersion, w.reseed())
		}
	default:
		// Written by a worker from before documents kept their evidence:
		// believed when the registry still holds a signed manifest for
		// its version; the next converge records the evidence.
		evd, err := w.cfg.registry.fetch(ctx, doc.Version)
		var r *refusal
		if errors.As(err, &r) {
			return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s records %s without signed evidence and the registry has no verifiable release %s (%s), so it is not believed and nothing ran; %s", w.cfg.Install, doc.Version, doc.Version, r.reason, w.reseed())
		}
		if err != nil {
			return installedState{}, err
		}
		if _, _, err := verifyEvidence(w.cfg.keys, doc.Version, evd); err != nil {
			if errors.As(err, &r) {
				return installedState{}, refuse(ruleInstalledUnverified, "the installed-version document of %s records %s without signed evidence and the registry's release %s does not verify (%s: %s), so it is not believed and nothing ran; %s", w.cfg.Install, doc.Version, doc.Version, r.rule, r.reason, w.reseed())
			}
			return installedState{}, err
		}
	}
	return st, nil
}

// reseed tells an operator how to start over from a version they vouch for.
func (w *Worker) reseed() string {
	return fmt.Sprintf("to re-seed, delete the document (nats kv del %s st.%s.%s.%s), set --installed-version (STEWARD_INSTALLED_VERSION) to what the install runs, and publish the release again", workers.CheckpointBucket, Name, w.cfg.Install, InstalledDoc)
}

// seed writes the seed form of the installed-version document before the
// first stage is saved, so that from then on the install has state and a
// missing document is refused rather than replaced by --installed-version.
func (w *Worker) seed(ctx context.Context, d *workers.Delivery, version string) error {
	doc := Installed{Version: version, Seed: true, EventID: d.Event.ID(), UpdatedAt: w.now().UTC()}
	if _, err := d.State().Put(ctx, InstalledDoc, doc, 0); err != nil {
		// Another process wrote it meanwhile: the retry decides again.
		return fmt.Errorf("seed installed version %s: %w", version, err)
	}
	return nil
}

// refusedOr reports err as a refusal when it is one, and returns any other
// error for a retry.
func (w *Worker) refusedOr(ctx context.Context, d *workers.Delivery, version string, err error) error {
	var r *refusal
	if errors.As(err, &r) {
		return w.refused(ctx, d, version, r)
	}
	return w.wrap(d, err)
}

// refused reports a refusal as an outcome and settles the event with the
// same words: nothing was recorded and nothing ran, and sending it back
// would only be refused again, so it is no dead letter.
func (w *Worker) refused(ctx context.Context, d *workers.Delivery, version string, r *refusal) error {
	if err := d.Emit(ctx, OutcomeRefused, Refused{Install: w.cfg.Install, Version: version, Rule: r.rule, Reason: r.reason}); err != nil {
		return w.wrap(d, err)
	}
	d.Log.Warn().Str("rule", r.rule).Str("reason", r.reason).Msg("release refused")
	return workers.Refused(w.wrap(d, fmt.Errorf("refused (%s): %w", r.rule, r)))
}

// runnerError retries what a retry can fix and reports the rest as a
// failed converge before any execution ran.
func (w *Worker) runnerError(ctx context.Context, d *workers.Delivery, rel release, err error) error {
	var rr *runnerRefusal
	if !errors.As(err, &rr) {
		return w.wrap(d, err)
	}
	if emitErr := d.Emit(ctx, OutcomeFailed, Failed{Install: rel.Install, Version: rel.Version, Condition: rr.Error()}); emitErr != nil {
		return w.wrap(d, emitErr)
	}
	// Settled, not retried: what Cloud Run refuses stays refused until
	// an operator changes something and publishes the release again.
	return workers.Refused(w.wrap(d, fmt.Errorf("release %s did not start, %s stays installed: %w", rel.Version, rel.From, err)))
}

// finish records and reports how the execution ended. Every step is
// idempotent, so a redelivery that reaches it again changes nothing.
func (w *Worker) finish(ctx context.Context, d *workers.Delivery, st stage) error {
	if !st.Result.Succeeded {
		if err := d.Emit(ctx, OutcomeFailed, Failed{Install: w.cfg.Install, Version: st.Version, Execution: st.Execution, Condition: st.Result.Condition}); err != nil {
			return w.wrap(d, err)
		}
		// The ops job ran and failed: it may have done part of the
		// upgrade, so running it again by itself could make things worse
		// (which is also why the job has max retries 0). The failure is a
		// decision, settled like a refusal: the outcome says what
		// happened, the installed version stays, and an operator decides,
		// then publishes the release again to retry it.
		return workers.Refused(w.wrap(d, fmt.Errorf("release %s failed in execution %s (%s); %s stays installed until an operator publishes it again", st.Version, st.Execution, st.Result.Condition, st.From)))
	}
	if err := w.record(ctx, d, st); err != nil {
		return w.wrap(d, err)
	}
	if err := d.Emit(ctx, OutcomeSucceeded, Succeeded{Install: w.cfg.Install, From: st.From, To: st.Version, Execution: st.Execution}); err != nil {
		return w.wrap(d, err)
	}
	d.Log.Info().Str("from", st.From).Str("to", st.Version).Str("execution", st.Execution).Msg("install converged")
	return nil
}

// record writes the installed version after a successful execution, with
// compare-and-swap, carrying the stage's evidence so that whoever reads it
// can verify it. The execution succeeding is what makes the install run the
// new version, so it is recorded even if the record moved meanwhile.
func (w *Worker) record(ctx context.Context, d *workers.Delivery, st stage) error {
	for range maxRecordRetries {
		var cur Installed
		rev, err := d.State().Get(ctx, InstalledDoc, &cur)
		if err != nil {
			return err
		}
		if rev != 0 && cur.Version == st.Version && cur.EventID == d.Event.ID() && cur.Evidence != nil {
			return nil
		}
		if cur.Version != st.From {
			d.Log.Warn().Str("recorded", cur.Version).Str("expected", st.From).Str("to", st.Version).Msg("the installed version changed while converging; recording the release that just ran")
		}
		doc := Installed{Version: st.Version, From: st.From, Execution: st.Execution, EventID: d.Event.ID(), UpdatedAt: w.now().UTC(), Evidence: st.Evidence}
		_, err = d.State().Put(ctx, InstalledDoc, doc, rev)
		if errors.Is(err, workers.ErrConflict) {
			continue
		}
		if err != nil {
			return fmt.Errorf("record installed version %s: %w", st.Version, err)
		}
		return nil
	}
	return fmt.Errorf("record installed version %s: %w", st.Version, workers.ErrConflict)
}

// release carries the verified release through the runner.
func (r release) log() *zerolog.Logger { return &r.logger }
