// Package platform is a platform team's own module, outside Steward's
// repository: TestExternalModule (external_test.go) copies it into a
// temporary folder, with a go.mod that requires Steward, and runs its
// tests. It may use only what Steward exports, so it must never import
// anything under github.com/steward-dev/steward/internal.
package platform

import (
	"path/filepath"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestReplayRecordedRotations replays rotations that `steward export`
// recorded through the real credential worker, in memory and then on the
// real runtime on an embedded server, and checks both do the same.
func TestReplayRecordedRotations(t *testing.T) {
	for name, opts := range map[string][]workertest.Option{
		"memory":  nil,
		"runtime": {workertest.WithRuntime()},
	} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "credentials")
			w, err := credential.New(credential.Config{Hive: "hive-1", AgeIdentity: "testdata/hive-1.agekey", CredentialDir: dir, ControllerKey: "testdata/controller.pub"})
			if err != nil {
				t.Fatal(err)
			}
			res := workertest.ReplayFile(t, "testdata/rotations.jsonl", w.Spec(), w, opts...)
			res.AssertVerdicts(workertest.Superseded, workertest.Refused, workertest.Applied, workertest.Refused)
			res.AssertOutcomes(events.OutcomeSuperseded, credential.OutcomeRefused, credential.OutcomeApplied, credential.OutcomeSkipped)
			res.AssertDeadLetters()
			if a := workertest.OutcomeAs[credential.Applied](res, credential.OutcomeApplied); a.Version != 3 || a.ClientID != "client-3" {
				t.Errorf("applied %+v, want version 3 with client-3", a)
			}
			if s := workertest.OutcomeAs[credential.Skipped](res, credential.OutcomeSkipped); s.Version != 2 || s.Applied != 3 {
				t.Errorf("skipped %+v, want version 2 below 3", s)
			}
		})
	}
}
