package converge

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestFiveQueuedReleasesConvergeInOrder publishes five releases before the
// worker starts, each requiring the one before it (minFromVersion). Converge
// is not latest-wins: every release is a step, so all five run, one at a
// time, in stream order, none superseded, and the install ends on the last.
func TestFiveQueuedReleasesConvergeInOrder(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	versions := []string{"1.1.0", "1.2.0", "1.3.0", "1.4.0", "1.5.0"}
	from := "1.0.0"
	for _, v := range versions {
		writeRelease(t, reg, key, manifest(v, from))
		from = v
	}
	ran := filepath.Join(t.TempDir(), "ran.txt")
	cmd := `printf '%s>%s\n' "$STEWARD_FROM_VERSION" "$STEWARD_TARGET_VERSION" >> ` + ran
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	for _, v := range versions {
		publishRelease(t, js, v, "")
	}
	_, r := startWorker(t, js, execConfig(t, reg, key, cmd))
	got := waitOutcomes(t, js, len(versions))
	workertest.WaitIdle(t, js, r.ConsumerName())

	for i, o := range got {
		s := outcomeData[Succeeded](t, o, OutcomeSucceeded)
		want := "1.0.0"
		if i > 0 {
			want = versions[i-1]
		}
		if s.From != want || s.To != versions[i] {
			t.Fatalf("outcome %d: %s to %s, want %s to %s", i, s.From, s.To, want, versions[i])
		}
	}
	raw, err := os.ReadFile(ran)
	if err != nil {
		t.Fatal(err)
	}
	if want := "1.0.0>1.1.0\n1.1.0>1.2.0\n1.2.0>1.3.0\n1.3.0>1.4.0\n1.4.0>1.5.0\n"; string(raw) != want {
		t.Fatalf("the ops job ran %q, want each step once, in order:\n%s", strings.TrimSpace(string(raw)), want)
	}
	if v := recorded(t, r); v != "1.5.0" {
		t.Fatalf("installed version %q, want 1.5.0", v)
	}
	noDeadLetters(t, js, r)
}
