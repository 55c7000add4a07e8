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

// Installed is the installed version as the worker records it after a
// successful converge. Before the first one, the configured
// InstalledVersion stands in for it.
type Installed struct {
	Version   string    `json:"version"`
	From      string    `json:"from,omitempty"`
	Execution string    `json:"execution,omitempty"`
	EventID   string    `json:"eventId,omitempty"`
	UpdatedAt time.Time `json:"updatedAt"`
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

// stage is the checkpointed progress of one release.published.
type stage struct {
	Stage          string  `json:"stage"`
	Version        string  `json:"version"`
	From           string  `json:"from"`
	Image          string  `json:"image"`
	ManifestDigest string  `json:"manifestDigest"`
	Marker         string  `json:"marker,omitempty"`
	Execution      string  `json:"execution,omitempty"`
	Result         *result `json:"result,omitempty"`
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
// stage an earlier delivery of the same event saved.
func (w *Worker) Handle(ctx context.Context, d *workers.Delivery) error {
	var ev events.ReleasePublished
	if err := d.DataAs(&ev); err != nil {
		return err
	}
	var st stage
	if _, err := d.LoadStage(&st); err != nil {
		return w.wrap(d, err)
	}
	if st.Stage == "" {
		rel, err := w.verify(ctx, d, ev)
		if err != nil {
			return err
		}
		st = stage{Stage: stageVerified, Version: rel.Version, From: rel.From, Image: rel.Image, ManifestDigest: rel.ManifestDigest}
		if err := d.SaveStage(ctx, st); err != nil {
			return w.wrap(d, err)
		}
		d.Log.Info().Str("version", rel.Version).Str("from", rel.From).Str("image", rel.Image).Msg("release verified")
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
func (w *Worker) verify(ctx context.Context, d *workers.Delivery, ev events.ReleasePublished) (release, error) {
	// The schema already refused a version that is not semver; checked
	// again here because the version is about to become a path or URL.
	if err := events.CheckVersion(ev.Version); err != nil {
		return release{}, w.refused(ctx, d, ev.Version, refuse(ruleVersionFormat, "%v, so it names no release in the registry and nothing ran", err))
	}
	cur, _, err := w.installed(ctx, d)
	if err != nil {
		return release{}, w.wrap(d, err)
	}
	if cur == "" {
		return release{}, w.refused(ctx, d, ev.Version, refuse(ruleInstalledUnknown, "the installed version of %s is unknown (nothing recorded and no --installed-version), so no release can be checked against it; set --installed-version to what the install runs", w.cfg.Install))
	}
	rel, err := w.fetchRelease(ctx, ev, cur)
	var r *refusal
	if errors.As(err, &r) {
		return release{}, w.refused(ctx, d, ev.Version, r)
	}
	if err != nil {
		return release{}, w.wrap(d, err)
	}
	return rel, nil
}

// installed returns the installed version and its document's revision: the
// recorded one, or before the first converge the configured one (revision
// 0). Nothing is written here, so a refusal records nothing.
func (w *Worker) installed(ctx context.Context, d *workers.Delivery) (string, uint64, error) {
	var doc Installed
	rev, err := d.State().Get(ctx, InstalledDoc, &doc)
	if err != nil {
		return "", 0, err
	}
	if rev == 0 {
		return w.cfg.InstalledVersion, 0, nil
	}
	return doc.Version, rev, nil
}

// refused reports a refusal and sends the event to the DLQ with the same
// words. Nothing was recorded and nothing ran.
func (w *Worker) refused(ctx context.Context, d *workers.Delivery, version string, r *refusal) error {
	if err := d.Emit(ctx, OutcomeRefused, Refused{Install: w.cfg.Install, Version: version, Rule: r.rule, Reason: r.reason}); err != nil {
		return w.wrap(d, err)
	}
	d.Log.Warn().Str("rule", r.rule).Str("reason", r.reason).Msg("release refused")
	return workers.Permanent(w.wrap(d, fmt.Errorf("refused (%s): %w", r.rule, r)))
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
	return workers.Permanent(w.wrap(d, fmt.Errorf("release %s did not start, %s stays installed: %w", rel.Version, rel.From, err)))
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
		// (which is also why the job has max retries 0). The failure is
		// permanent: the event goes to the DLQ, the installed version
		// stays, and an operator decides, then publishes the release
		// again to retry it.
		return workers.Permanent(w.wrap(d, fmt.Errorf("release %s failed in execution %s (%s); %s stays installed until an operator publishes it again", st.Version, st.Execution, st.Result.Condition, st.From)))
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
// compare-and-swap. The execution succeeding is what makes the install run
// the new version, so it is recorded even if the record moved meanwhile.
func (w *Worker) record(ctx context.Context, d *workers.Delivery, st stage) error {
	for range maxRecordRetries {
		cur, rev, err := w.installed(ctx, d)
		if err != nil {
			return err
		}
		if rev != 0 && cur == st.Version {
			return nil
		}
		if cur != st.From {
			d.Log.Warn().Str("recorded", cur).Str("expected", st.From).Str("to", st.Version).Msg("the installed version changed while converging; recording the release that just ran")
		}
		doc := Installed{Version: st.Version, From: st.From, Execution: st.Execution, EventID: d.Event.ID(), UpdatedAt: w.now().UTC()}
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
