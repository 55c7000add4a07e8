package credential_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// Example_replayRecordedStream is a platform team testing its hive's
// credential setup against what really happened on its bus.
//
// The stream was recorded from a bus with
//
//	steward export --stream STEWARD_EVENTS \
//	  --subject 'steward.events.credential.rotated.hive-1' --out testdata/rotations.jsonl
//
// and holds four rotations of hive-1: version 1; a version 2 whose secret
// was encrypted to the wrong key; version 3; and version 2 again,
// republished late. testdata/hive-1.agekey is a test identity committed on
// purpose: it opens the made-up secrets of that stream and nothing else. A
// team keeps its real identities out of its repository and records its
// test streams with a test identity like this one.
//
// ReplayFile runs the stream through the real worker (credential.New, as
// `steward worker credential` builds it) in memory, with the runtime's
// rules: the four events arrive queued together, so version 1 is
// superseded by the newer verified version 3 behind it; the version 2 that
// does not open ranks nowhere, reaches the handler and is refused; version
// 3 is applied; the late version 2 is skipped as stale. Refusals and skips
// are settled with their outcome, never dead letters. Add
// workertest.WithRuntime() to ReplayFile to run the same stream through
// the real runtime on an embedded JetStream server instead.
func Example_replayRecordedStream() {
	// In a test, use the test's own t; an example has none, so exampleTB
	// panics on the first failure, which fails the example all the same.
	var t testing.TB = exampleTB{}

	dir, err := os.MkdirTemp("", "hive-1") // in a test: t.TempDir()
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	w, err := credential.New(credential.Config{
		Hive:          "hive-1",
		AgeIdentity:   "testdata/hive-1.agekey",
		CredentialDir: filepath.Join(dir, "credentials"),
		ControllerKey: "testdata/controller.pub",
	})
	if err != nil {
		panic(err)
	}

	res := workertest.ReplayFile(t, "testdata/rotations.jsonl", w.Spec(), w)

	// What a test asserts: each event's verdict, the outcomes in order,
	// and that nothing was dead-lettered.
	res.AssertVerdicts(workertest.Superseded, workertest.Refused, workertest.Applied, workertest.Refused)
	res.AssertOutcomes(events.OutcomeSuperseded, credential.OutcomeRefused, credential.OutcomeApplied, credential.OutcomeSkipped)
	res.AssertDeadLetters()

	// What happened, event by event: the ids are the recorded events'
	// own, the sequences the replay's.
	for _, s := range res.Events {
		fmt.Printf("seq %d, event %s: %s\n", s.Sequence, s.ID, s.Verdict)
	}
	superseded := workertest.OutcomeAs[events.Superseded](res, events.OutcomeSuperseded)
	fmt.Printf("version 1 was superseded by event %s\n", superseded.SupersededBy)
	refused := workertest.OutcomeAs[credential.Refused](res, credential.OutcomeRefused)
	fmt.Printf("refused version %d: %s\n", refused.Version, refused.Reason)
	applied := workertest.OutcomeAs[credential.Applied](res, credential.OutcomeApplied)
	fmt.Printf("applied version %d to %s, client id %s\n", applied.Version, applied.Hive, applied.ClientID)
	skipped := workertest.OutcomeAs[credential.Skipped](res, credential.OutcomeSkipped)
	fmt.Printf("skipped version %d, version %d is applied\n", skipped.Version, skipped.Applied)

	// And what the hive's agents read: the pair of version 3.
	clientID, err := os.ReadFile(filepath.Join(dir, "credentials", credential.ClientIDFile))
	if err != nil {
		panic(err)
	}
	fmt.Printf("client_id: %s\n", clientID)

	// Output:
	// seq 1, event 01M8REW6C36G4YSX25AYVW0RN8: superseded
	// seq 2, event 01M8REW6CE55218RDW2WZZJFS3: refused
	// seq 3, event 01M8REW6CE55218RDW30YCR7EA: applied
	// seq 4, event 01M8REW6CFW8S3JVQ01M3YED0N: refused
	// version 1 was superseded by event 01M8REW6CE55218RDW30YCR7EA
	// refused version 2: the secret of version 2 is not encrypted to this hive's identity but to another key; encrypt it to age1e8jkk9tm4djdkdutda63uhfp54z480jpeqxevtgl8n37rsp4y34q9afm96; the files were left as they were (version 0); publish a corrected rotation with a version above 0
	// applied version 3 to hive-1, client id client-3
	// skipped version 2, version 3 is applied
	// client_id: client-3
}

// exampleTB is the testing.TB an example hands to workertest, which
// reports through it: the first failure panics with the message. Only the
// methods workertest calls in memory are implemented; the embedded
// interface is nil.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                           {}
func (exampleTB) Error(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
