package credential_test

import (
	"path/filepath"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestRecordedStreamOnTheRuntime replays the example's recorded stream
// through the real runtime on an embedded server: it must come out as the
// in-memory replay says (Example_replayRecordedStream), or the in-memory
// model of supersession and refusal has drifted from the runtime.
func TestRecordedStreamOnTheRuntime(t *testing.T) {
	w, err := credential.New(credential.Config{
		Hive: "hive-1", AgeIdentity: "testdata/hive-1.agekey",
		CredentialDir: filepath.Join(t.TempDir(), "credentials"), ControllerKey: "testdata/controller.pub",
	})
	if err != nil {
		t.Fatal(err)
	}
	res := workertest.ReplayFile(t, "testdata/rotations.jsonl", w.Spec(), w, workertest.WithRuntime())
	res.AssertVerdicts(workertest.Superseded, workertest.Refused, workertest.Applied, workertest.Refused)
	res.AssertOutcomes(events.OutcomeSuperseded, credential.OutcomeRefused, credential.OutcomeApplied, credential.OutcomeSkipped)
	res.AssertDeadLetters()
	if a := workertest.OutcomeAs[credential.Applied](res, credential.OutcomeApplied); a.Version != 3 || a.ClientID != "client-3" {
		t.Errorf("applied %+v, want version 3 with client-3", a)
	}
	if s := workertest.OutcomeAs[credential.Skipped](res, credential.OutcomeSkipped); s.Version != 2 || s.Applied != 3 {
		t.Errorf("skipped %+v, want version 2 below 3", s)
	}
}
