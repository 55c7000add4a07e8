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
//
// The checkpoint bucket is writable by others (docs/design.md §7), so
// nothing in it moves the install on its own say: a stage's signed
// evidence is verified again, and what it says of an execution is checked
// with the runner (the execution exists in this install's job, was started
// for this event, ran exactly the signed image; its result is the
// runner's). Executions are labelled with their event and found by it
// before anything starts. The installed version is believed from a
// document only as far as its signed evidence verifies (or as the seed
// equal to --installed-version); otherwise it is rebuilt from the runner's
// newest succeeded execution, or the worker holds and names the re-seed.
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
func (w *Worker) Spec() workers.Spec { return SpecFor(w.cfg.Install) }

// SpecFor is the Spec of the worker of install. It needs nothing of the
// Config but the instance, so a dry run (steward replay --dry-run, which
// decodes and validates and handles nothing) reads the instance's subjects
// without the registry, keys and runner a handler needs.
func SpecFor(install string) workers.Spec {
	k, _ := events.Lookup(events.TypeReleasePublished)
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
// verified again from signed material and, for what it says of an
// execution, from the runner.
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
	if resumed && st.Stage != "" {
		if err := w.recheck(ctx, d, ev, &st); err != nil {
			return err
		}
		if st.Stage == stageRunning || st.Stage == stageDone {
			ok, err := w.confirm(ctx, d, &st)
			if err != nil {
				return w.wrap(d, err)
			}
			if !ok {
				// Discarded: the release is decided afresh below, as if
				// no stage had been saved.
				st = stage{}
			}
		}
	}
	if st.Stage == "" {
		rel, evd, inst, err := w.verify(ctx, d, ev, resumed)
		if err != nil {
			return err
		}
		if inst.seed {
			// From here on the install has state: a stage that finds no
			// installed-version document was tampered with.
			if err := w.seed(ctx, d, inst); err != nil {
				return w.wrap(d, err)
			}
		}
		st = stage{Stage: stageVerified, Version: rel.Version, From: rel.From, Image: rel.Image, ManifestDigest: rel.ManifestDigest, Evidence: &evd}
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
		d.Log.Info().Str("version", rel.Version).Str("from", rel.From).Str("image", rel.Image).Msg("release verified")
	}
	rel := w.releaseOf(d, st)
	if st.Stage == stageVerified || st.Stage == stageJobEnsured {
		// Before anything starts, the runner is asked whether this event
		// already has an execution: a start whose answer was lost, a
		// stage that was removed or discarded. Watching it is
		// converging; starting a second would run the upgrade twice.
		x, found, err := w.run.find(ctx, rel)
		if err != nil {
			return w.wrap(d, err)
		}
		if found {
			if x.Image != rel.Image {
				return w.foreign(ctx, d, rel, x)
			}
			d.Log.Warn().Str("execution", x.Name).Str("stage", st.Stage).Msg("the runner already has an execution of this event; watching it instead of starting a second")
			st.Stage, st.Execution = stageRunning, x.Name
			if err := d.SaveStage(ctx, st); err != nil {
				return w.wrap(d, err)
			}
		}
	}
	if st.Stage == stageVerified {
		if err := w.run.ensure(ctx, rel); err != nil {
			return w.runnerError(ctx, d, rel, err)
		}
		st.Stage = stageJobEnsured
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
	}
	if st.Stage == stageJobEnsured {
		execution, err := w.run.start(ctx, rel)
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

func (w *Worker) releaseOf(d *workers.Delivery, st stage) release {
	return release{Install: w.cfg.Install, EventID: d.Event.ID(), Version: st.Version, From: st.From, Image: st.Image, ManifestDigest: st.ManifestDigest, logger: d.Log}
}

// confirm checks what a running or done stage says of the outside world
// with the runner, which the stage's signed evidence cannot vouch for: the
// execution must be one the runner has, of this install's job, started for
// this very event, running exactly the stage's (signed) image. Whoever can
// write the checkpoint bucket can copy a genuine manifest and signature
// from the registry into a stage and claim success; only the runner knows
// whether anything ran. A stage that fails is discarded (false), so it
// moves nothing and the release is decided afresh. A stage that passes
// is watched again: its saved result is never taken, only the runner's.
func (w *Worker) confirm(ctx context.Context, d *workers.Delivery, st *stage) (bool, error) {
	x, found, err := w.run.lookup(ctx, w.releaseOf(d, *st), st.Execution)
	if err != nil {
		return false, fmt.Errorf("check the execution %q of the checkpointed stage %q with the runner: %w", st.Execution, st.Stage, err)
	}
	var why string
	switch {
	case !found:
		why = fmt.Sprintf("names execution %q, which the runner does not have for install %s", st.Execution, w.cfg.Install)
	case !x.forEvent(d.Event.ID()):
		why = fmt.Sprintf("names execution %s, which the runner started for event %q, not for this one", x.Name, x.EventID)
	case x.Image != st.Image:
		why = fmt.Sprintf("names execution %s, which ran image %q, not release %s's signed %q", x.Name, x.Image, st.Version, st.Image)
	}
	if why != "" {
		d.Log.Warn().Str("stage", st.Stage).Str("execution", st.Execution).Str("reason", why).
			Msg("checkpointed stage discarded: its claim about the runner is false, so it moves nothing and the release is decided again")
		return false, nil
	}
	st.Stage, st.Result = stageRunning, nil
	return true, nil
}

// foreign settles an event whose execution, as the runner has it, ran
// another image than the release's signed one. It may have applied part of
// something, so it is never run again by itself: the install stays, and an
// operator looks at the execution, then publishes the release again.
func (w *Worker) foreign(ctx context.Context, d *workers.Delivery, rel release, x execution) error {
	cond := fmt.Sprintf("execution %s was started for this event but ran image %q, not release %s's signed %q; it is not run again, %s stays installed until an operator checks the install and publishes the release again", x.Name, x.Image, rel.Version, rel.Image, rel.From)
	if err := d.Emit(ctx, OutcomeFailed, Failed{Install: w.cfg.Install, Version: rel.Version, Execution: x.Name, Condition: cond}); err != nil {
		return w.wrap(d, err)
	}
	return workers.Refused(w.wrap(d, errors.New(cond)))
}

func (w *Worker) wrap(d *workers.Delivery, err error) error {
	return fmt.Errorf("converge %s, event %s: %w", w.cfg.Install, d.Event.ID(), err)
}

// verify reads the installed version and the release, and refuses what the
// install may not move to.
func (w *Worker) verify(ctx context.Context, d *workers.Delivery, ev events.ReleasePublished, hadStage bool) (release, Evidence, installedState, error) {
	// The schema already refused a version that is not semver; checked
	// again here because the version is about to become a path or URL.
	if err := events.CheckVersion(ev.Version); err != nil {
		return release{}, Evidence{}, installedState{}, w.refused(ctx, d, ev.Version, refuse(ruleVersionFormat, "%v, so it names no release in the registry and nothing ran", err))
	}
	inst, err := w.installed(ctx, d, hadStage)
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
	// rev is the document's revision; 0 when there is none.
	rev uint64
	doc Installed
	// seed is set when the version is --installed-version's and the
	// seed form is to be written over rev before the first stage.
	seed bool
}

// installed returns the installed version, verified. A document carrying
// evidence is believed as far as its signed manifest verifies and names its
// version; the seed form only while it equals --installed-version. Nothing
// else in the bucket is believed, since anyone who can write the bucket can
// write it: a document that is missing, unreadable, without evidence (as
// workers before evidence wrote them) or whose evidence does not verify is
// rebuilt from the runner (rebuild), so the installed version never reads
// as absent or lower because a document was removed or replaced. hadStage
// says this event has a checkpointed stage, so the install has state and
// a missing document is no first start.
func (w *Worker) installed(ctx context.Context, d *workers.Delivery, hadStage bool) (installedState, error) {
	var raw json.RawMessage
	rev, err := d.State().Get(ctx, InstalledDoc, &raw)
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		// Not JSON at all: its revision is unknown, so the rebuilt
		// document is not written over it.
		return w.rebuild(ctx, d, fmt.Sprintf("is not readable (%v)", err), 0, false, hadStage)
	}
	if errors.Is(err, workers.ErrUntrusted) {
		// Not signed by this instance (docs/design.md §7): whatever it
		// says is not believed, and the document is rebuilt from the
		// runner over its revision.
		return w.rebuild(ctx, d, "does not verify as this instance's own", rev, false, hadStage)
	}
	if err != nil {
		return installedState{}, err
	}
	if rev == 0 {
		return w.rebuild(ctx, d, "is missing", 0, true, hadStage)
	}
	var doc Installed
	if err := json.Unmarshal(raw, &doc); err != nil {
		return w.rebuild(ctx, d, fmt.Sprintf("is not readable (%v)", err), rev, false, hadStage)
	}
	if err := events.CheckVersion(doc.Version); err != nil {
		return w.rebuild(ctx, d, fmt.Sprintf("records %q (%v)", doc.Version, err), rev, false, hadStage)
	}
	switch {
	case doc.Evidence != nil:
		if _, _, err := verifyEvidence(w.cfg.keys, doc.Version, *doc.Evidence); err != nil {
			var r *refusal
			if !errors.As(err, &r) {
				return installedState{}, err
			}
			return w.rebuild(ctx, d, fmt.Sprintf("records %s but its evidence does not verify (%s: %s)", doc.Version, r.rule, r.reason), rev, false, hadStage)
		}
	case doc.Seed:
		if doc.Version != w.cfg.InstalledVersion {
			return w.rebuild(ctx, d, fmt.Sprintf("is a seed for %s carrying no signed evidence, and --installed-version is %q; an unsigned seed is believed only while it equals --installed-version", doc.Version, w.cfg.InstalledVersion), rev, false, hadStage)
		}
	default:
		// Workers before evidence wrote this form; it proves nothing,
		// whatever the registry holds for its version.
		return w.rebuild(ctx, d, fmt.Sprintf("records %s without signed evidence and is no seed, so it is not believed", doc.Version), rev, false, hadStage)
	}
	return installedState{version: doc.Version, rev: rev, doc: doc}, nil
}

// rebuild finds the installed version from the runner when the document
// cannot be believed (found says what was found; rev is its revision, 0 when
// missing or unknown). The rule, in order:
//   - the newest succeeded Steward execution of this install's job is what
//     the install runs, if the version it was labelled with has a signed
//     manifest in the registry that verifies and whose opsImage is exactly
//     the image the execution ran: the document is rewritten from it, with
//     that evidence;
//   - a runner that keeps a record and has no succeeded execution of this
//     install never moved it, so --installed-version stands (a first start
//     or a seed removed before any success);
//   - a runner that keeps no record (the exec runner without
//     --exec-record-dir) takes a missing document as a first start only
//     while this event has no stage;
//   - anything else (the newest success does not verify, or nothing is
//     recorded to tell) holds: a plain error, retried, never a refusal of
//     the release, naming the re-seed. Nothing older than the newest
//     success is ever taken in its place, since that would let a release
//     run again.
func (w *Worker) rebuild(ctx context.Context, d *workers.Delivery, found string, rev uint64, missing, hadStage bool) (installedState, error) {
	what := fmt.Sprintf("the installed-version document of %s %s", w.cfg.Install, found)
	hold := func(format string, args ...any) error {
		return fmt.Errorf("%s, and %s; the installed version is unknown, so this release is held (retried, not refused) and nothing ran; %s", what, fmt.Sprintf(format, args...), w.reseed())
	}
	if w.cfg.Reseed && w.cfg.InstalledVersion != "" {
		// The operator vouches for --installed-version: it is written
		// as this instance's own signed seed over what was not believed.
		d.Log.Warn().Str("found", found).Str("installed", w.cfg.InstalledVersion).Msg("installed-version document not believed; --reseed takes --installed-version instead")
		return installedState{version: w.cfg.InstalledVersion, rev: rev, seed: true}, nil
	}
	hist, kept, err := w.run.history(ctx)
	if err != nil {
		return installedState{}, fmt.Errorf("%s; reading the runner's executions to rebuild it: %w", what, err)
	}
	var newest *execution
	for i := range hist {
		if hist[i].Done && hist[i].Result.Succeeded {
			newest = &hist[i]
			break
		}
	}
	if newest == nil {
		if !kept && !(missing && !hadStage) {
			return installedState{}, hold("the exec runner keeps no record of its executions to rebuild it from (set --exec-record-dir so it does)")
		}
		if w.cfg.InstalledVersion == "" {
			return installedState{}, refuse(ruleInstalledUnknown, "the installed version of %s is unknown (%s, no execution of it succeeded, and no --installed-version), so no release can be checked against it and nothing ran; set --installed-version to what the install runs", w.cfg.Install, what)
		}
		if !missing {
			d.Log.Warn().Str("found", found).Str("installed", w.cfg.InstalledVersion).Msg("installed-version document not believed; the runner has no succeeded execution of this install, so --installed-version stands")
		}
		return installedState{version: w.cfg.InstalledVersion, rev: rev, seed: rev != 0 || missing}, nil
	}
	x := *newest
	if x.Version == "" || events.CheckVersion(x.Version) != nil {
		return installedState{}, hold("the newest succeeded execution %s carries no version Steward labelled it with (%q)", x.Name, x.Version)
	}
	evd, err := w.cfg.registry.fetch(ctx, x.Version)
	var r *refusal
	if errors.As(err, &r) {
		return installedState{}, hold("release %s, which its newest succeeded execution %s ran, has no verifiable release in the registry (%s)", x.Version, x.Name, r.reason)
	}
	if err != nil {
		return installedState{}, fmt.Errorf("%s; reading release %s of its newest succeeded execution %s to rebuild it: %w", what, x.Version, x.Name, err)
	}
	m, _, err := verifyEvidence(w.cfg.keys, x.Version, evd)
	if errors.As(err, &r) {
		return installedState{}, hold("release %s, which its newest succeeded execution %s ran, does not verify (%s: %s)", x.Version, x.Name, r.rule, r.reason)
	}
	if err != nil {
		return installedState{}, err
	}
	if m.OpsImage != x.Image {
		return installedState{}, hold("its newest succeeded execution %s, labelled %s, ran image %q, not release %s's signed %q", x.Name, x.Version, x.Image, x.Version, m.OpsImage)
	}
	doc := Installed{Version: x.Version, Execution: x.Name, EventID: x.EventID, UpdatedAt: w.now().UTC(), Evidence: &evd}
	if missing || rev != 0 {
		next, err := d.State().Put(ctx, InstalledDoc, doc, rev)
		if err != nil {
			// Another process wrote it meanwhile: the retry decides again.
			return installedState{}, fmt.Errorf("%s; writing it rebuilt as %s from execution %s: %w", what, x.Version, x.Name, err)
		}
		rev = next
	}
	d.Log.Warn().Str("found", found).Str("installed", x.Version).Str("execution", x.Name).Msg("installed-version document rebuilt from the runner's newest succeeded execution")
	return installedState{version: x.Version, rev: rev, doc: doc}, nil
}

// reseed tells an operator how to start over from a version they vouch for:
// the seed form is the one document believed without evidence, and only
// while the worker's own configuration says the same.
func (w *Worker) reseed() string {
	return "to re-seed from a version you vouch for, restart the worker with --installed-version <version> --reseed (STEWARD_INSTALLED_VERSION, STEWARD_RESEED=true): it writes that version as its own signed seed, the held release is then retried by itself, and --reseed can go"
}

// seed writes the seed form of the installed-version document before the
// first stage is saved (over whatever unbelieved document was there), so
// that from then on the install has state and a missing document is never
// taken for a first start.
func (w *Worker) seed(ctx context.Context, d *workers.Delivery, inst installedState) error {
	doc := Installed{Version: inst.version, Seed: true, EventID: d.Event.ID(), UpdatedAt: w.now().UTC()}
	if _, err := d.State().Put(ctx, InstalledDoc, doc, inst.rev); err != nil {
		// Another process wrote it meanwhile: the retry decides again.
		return fmt.Errorf("seed installed version %s: %w", inst.version, err)
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
		// Read as raw JSON: a document that is not one (forged, spoiled)
		// is written over all the same, since the execution just
		// succeeded is what the install now runs.
		var raw json.RawMessage
		var cur Installed
		rev, err := d.State().Get(ctx, InstalledDoc, &raw)
		if err != nil && !errors.Is(err, workers.ErrUntrusted) {
			return err
		}
		if rev != 0 && err == nil {
			_ = json.Unmarshal(raw, &cur)
		}
		if rev != 0 && cur.Version == st.Version && cur.EventID == d.Event.ID() && cur.Evidence != nil {
			return nil
		}
		if cur.Version != st.From {
			d.Log.Warn().Str("recorded", cur.Version).Str("expected", st.From).Str("to", st.Version).Msg("the installed version changed while converging; recording the release that just ran")
		}
		doc := Installed{Version: st.Version, From: st.From, Execution: st.Execution, EventID: d.Event.ID(), UpdatedAt: w.now().UTC(), Evidence: st.Evidence}
		_, err = d.State().Put(ctx, InstalledDoc, doc, rev)
		if errors.Is(err, events.ErrConflict) {
			continue
		}
		if err != nil {
			return fmt.Errorf("record installed version %s: %w", st.Version, err)
		}
		return nil
	}
	return fmt.Errorf("record installed version %s: %w", st.Version, events.ErrConflict)
}

// release carries the verified release through the runner.
func (r release) log() *zerolog.Logger { return &r.logger }
