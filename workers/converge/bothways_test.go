package converge

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/bothways"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestStoriesBothWays runs each story of install shop (installed 1.0.0) in
// memory and on the real runtime on an embedded server (issue 24): both
// must come to the story's verdicts, outcomes, dead letters, installed
// version and the releases Cloud Run ran, and to the same ones, outcome
// data and the whole installed document included. Converge is not latest-wins: every release is a step,
// applied in stream order. Each run has its own Cloud Run fake, so the two
// name their executions alike.
func TestStoriesBothWays(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	other := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	from := "1.0.0"
	for _, v := range []string{"1.1.0", "1.2.0", "1.3.0"} {
		writeRelease(t, reg, key, manifest(v, from))
		from = v
	}
	writeRelease(t, reg, key, manifest("0.9.0", "0.1.0"))
	// 2.0.1: a signature file that is no signature; 2.0.2: signed by
	// another key; 2.0.7: an image by tag, not by digest.
	writeRelease(t, reg, key, manifest("2.0.1", "1.0.0"))
	mustWrite(t, filepath.Join(reg, "2.0.1", SignatureFile), "bm90IGEgc2lnbmF0dXJl\n")
	writeRelease(t, reg, other, manifest("2.0.2", "1.0.0"))
	unpinned := manifest("2.0.7", "1.0.0")
	unpinned.OpsImage = "europe-docker.pkg.dev/steward-test/ops/shop-ops:2.0.7"
	writeRelease(t, reg, key, unpinned)

	release := func(version string) bothways.Step {
		e, err := events.New(events.TypeReleasePublished, version, events.ReleasePublished{Version: version})
		if err != nil {
			t.Fatal(err)
		}
		return bothways.Step{What: "release.published " + version, Event: e}
	}
	raw := func(what, typ, key string, data map[string]any) bothways.Step {
		return bothways.Step{What: what, Event: bothways.Raw(t, typ, key, data)}
	}
	v := func(list ...workertest.Verdict) []workertest.Verdict { return list }
	ran := func(versions ...string) map[string]any {
		return map[string]any{"cloudRun": map[string]any{"ran": append([]string{}, versions...)}}
	}
	installed := func(version, from string) map[string]any {
		return map[string]any{InstalledDoc: map[string]any{"version": version, "from": from, "updatedAt": bothwaysNow.Format(time.RFC3339)}}
	}
	r110 := release("1.1.0")

	stories := []bothways.Story{
		{
			Name:  "happy path",
			Steps: []bothways.Step{r110},
			Want:  bothways.Want{Verdicts: v(workertest.Applied), Outcomes: []string{"shop succeeded"}, State: installed("1.1.0", "1.0.0"), Effects: ran("1.1.0")},
		},
		{
			Name:  "every release is a step, applied in order: none is superseded",
			Steps: []bothways.Step{release("1.1.0"), release("1.2.0"), release("1.3.0")},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied, workertest.Applied),
				Outcomes: []string{"shop succeeded", "shop succeeded", "shop succeeded"},
				State:    installed("1.3.0", "1.2.0"), Effects: ran("1.1.0", "1.2.0", "1.3.0"),
			},
		},
		{
			Name:  "the same release republished is refused as the installed version",
			Steps: []bothways.Step{release("1.1.0"), release("1.1.0")},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Refused),
				Outcomes: []string{"shop succeeded", "shop refused"},
				State:    installed("1.1.0", "1.0.0"), Effects: ran("1.1.0"),
			},
		},
		{
			Name:  "the same event twice (one id): stored once",
			Steps: []bothways.Step{r110, r110},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied),
				Outcomes: []string{"shop succeeded"},
				State:    installed("1.1.0", "1.0.0"), Effects: ran("1.1.0"),
			},
			Right: bothways.OnRuntime,
		},
		{
			Name:  "policy refusals: a downgrade, a bad signature, another key's signature, an unpinned image; then a good release applies",
			Steps: []bothways.Step{release("0.9.0"), release("2.0.1"), release("2.0.2"), release("2.0.7"), release("1.1.0")},
			Want: bothways.Want{
				Verdicts: v(workertest.Refused, workertest.Refused, workertest.Refused, workertest.Refused, workertest.Applied),
				Outcomes: []string{"shop refused", "shop refused", "shop refused", "shop refused", "shop succeeded"},
				State:    installed("1.1.0", "1.0.0"), Effects: ran("1.1.0"),
			},
		},
		{
			Name: "bad inputs go to the DLQ without reaching the handler",
			Steps: []bothways.Step{
				raw("a field the schema does not have", events.TypeReleasePublished, "1.1.0", map[string]any{"version": "1.1.0", "image": "evil"}),
				raw("a version that is a path", events.TypeReleasePublished, "../1.0.0", map[string]any{"version": "../1.0.0"}),
				raw("a version with '>'", events.TypeReleasePublished, "1.1.0>", map[string]any{"version": "1.1.0>"}),
				raw("a type no worker handles", "dev.example.release.yanked.v1", "1.1.0", map[string]any{"version": "1.1.0"}),
				raw("subject 1.1.0, data naming 1.2.0", events.TypeReleasePublished, "1.1.0", map[string]any{"version": "1.2.0"}),
			},
			Want: bothways.Want{
				Verdicts: v(workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered, workertest.DeadLettered),
				DeadLetters: []string{`"image"`, "/version: does not match pattern", "/version: does not match pattern",
					"is not a Steward event type", `must equal the data's version "1.2.0"`},
				State: map[string]any{}, Effects: ran(),
			},
		},
	}
	for _, s := range stories {
		t.Run(s.Name, func(t *testing.T) {
			installRunner(reg, key, 0, 1).Run(t, s)
		})
	}

	// Cloud Run unavailable for the first GetJob calls (down), with the
	// handler given attempts tries (workertest.WithAttempts).
	retries := []struct {
		down, attempts int
		story          bothways.Story
	}{
		{2, 3, bothways.Story{
			Name:  "Cloud Run unavailable twice: the release is tried again and applies once it passes",
			Steps: []bothways.Step{release("1.1.0"), release("1.2.0")},
			Want: bothways.Want{
				Verdicts: v(workertest.Applied, workertest.Applied),
				Outcomes: []string{"shop succeeded", "shop succeeded"},
				State:    installed("1.2.0", "1.1.0"), Effects: ran("1.1.0", "1.2.0"),
			},
		}},
		{3, 1, bothways.Story{
			Name:  "Cloud Run unavailable: the release is retried and the next one waits behind it",
			Steps: []bothways.Step{release("1.1.0"), release("1.2.0")},
			Want: bothways.Want{
				Verdicts: v(workertest.Retried, workertest.Waiting),
				// The seed from --installed-version, written before the
				// first converge, and nothing run.
				State: map[string]any{InstalledDoc: map[string]any{"version": "1.0.0", "seed": true}}, Effects: ran(),
			},
			KnownDivergence: "on the runtime Replay waits until the waiting release has been tried, so the runtime retries the first past WithAttempts until Cloud Run answers and both apply (with a failure that lasts, Replay fails after 30s); in memory the first is retried once and the second waits",
			Right:           bothways.InMemory,
		}},
	}
	for _, r := range retries {
		t.Run(r.story.Name, func(t *testing.T) {
			installRunner(reg, key, r.down, r.attempts).Run(t, r.story)
		})
	}
}

// bothwaysNow is the clock of both runs, so the installed document's
// updatedAt is the same in both.
var bothwaysNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// installRunner makes a fresh converge worker of the test install for
// each run, with its own Cloud Run fake, unavailable for the first down
// GetJob calls, and the fixed clock; a failing event is tried attempts
// times (on the runtime after a short backoff).
func installRunner(reg string, key keyPair, down, attempts int) bothways.Runner {
	return bothways.Runner{New: func(t *testing.T, _ bothways.Mode) bothways.Worker {
		fake := cloudrunfake.Start(t)
		for range down {
			fake.FailNext("GetJob", codes.Unavailable)
		}
		w, err := New(cloudRunConfig(reg, key, fake))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		w.now = func() time.Time { return bothwaysNow }
		return bothways.Worker{
			Spec: w.Spec(), Handler: w,
			Runtime: []workers.Option{fastRetries()},
			Options: []workertest.Option{workertest.WithAttempts(attempts)},
			Effects: func(*testing.T) map[string]any {
				return map[string]any{"cloudRun": map[string]any{"ran": ranVersions(fake)}}
			},
		}
	}}
}

// ranVersions lists the releases whose ops image the fake's executions
// ran, oldest first, by version (image of the version), or the image
// itself when it is no release's.
func ranVersions(fake *cloudrunfake.Server) []string {
	out := []string{}
	for _, name := range fake.Executions() {
		img := ""
		if cs := fake.Execution(name).GetTemplate().GetContainers(); len(cs) > 0 {
			img = cs[0].GetImage()
		}
		ran := img
		for _, v := range []string{"0.9.0", "1.1.0", "1.2.0", "1.3.0", "2.0.1", "2.0.2", "2.0.7"} {
			if img == image(v) {
				ran = v
			}
		}
		out = append(out, ran)
	}
	return out
}
