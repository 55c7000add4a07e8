package join_test

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// testArmScript is the arm command of the tests: it appends its arguments
// to arm.log (so runs can be counted), fails once while fail-once exists
// (removing the files that file lists first), and otherwise writes the
// armed marker from the enrollment file, as a real guard would.
const testArmScript = `#!/bin/sh
set -eu
here=$(dirname "$0")
echo "$*" >> "$here/arm.log"
if [ -e "$here/fail-once" ]; then
  while IFS= read -r f; do [ -n "$f" ] && rm -f "$f"; done < "$here/fail-once"
  rm -f "$here/fail-once"
  echo "arm: the guard daemon is not ready" >&2
  exit 3
fi
policy='' identity='' enrollment=''
while [ $# -gt 0 ]; do
  case "$1" in
    -policy) policy=$2; shift 2 ;;
    -identity) identity=$2; shift 2 ;;
    -enrollment) enrollment=$2; shift 2 ;;
    *) echo "arm: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -r "$policy" ] && [ -r "$identity" ] && [ -r "$enrollment" ] || { echo "arm: a file is missing" >&2; exit 2; }
cp "$enrollment" "$here/armed.json.tmp"
mv -f "$here/armed.json.tmp" "$here/armed.json"
`

// issued is the issuedAt of the fixture's default invitation.
var issued = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// fixture is one box with real keys, a real identity record, a real opt
// dir and a real arm command.
type fixture struct {
	t       *testing.T
	dir     string
	cfg     join.Config
	console crypto.Signer
	release crypto.Signer
}

func newFixture(t *testing.T, box string) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{t: t, dir: dir}
	for _, name := range []string{"console", "release"} {
		if err := signing.GenerateKeyPair(signing.Ed25519, filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")); err != nil {
			t.Fatal(err)
		}
	}
	f.console = f.loadKey("console.key")
	f.release = f.loadKey("release.key")
	instance := "i-" + box
	f.writeJSON("identity.json", join.IdentityRecord{Box: box, InstanceID: instance})
	f.write("instance-id", instance+"\n", 0o644)
	f.write("arm.sh", testArmScript, 0o755)
	if err := os.Mkdir(filepath.Join(dir, "opt"), 0o755); err != nil {
		t.Fatal(err)
	}
	f.cfg = join.Config{
		Box:            box,
		Deployment:     "dep",
		ConsoleKey:     filepath.Join(dir, "console.pub"),
		ReleaseKey:     filepath.Join(dir, "release.pub"),
		IdentityRecord: filepath.Join(dir, "identity.json"),
		InstanceIDFile: filepath.Join(dir, "instance-id"),
		OptDir:         filepath.Join(dir, "opt"),
		ArmCommand:     filepath.Join(dir, "arm.sh"),
		ArmedMarker:    filepath.Join(dir, "armed.json"),
	}
	return f
}

func (f *fixture) path(name string) string { return filepath.Join(f.dir, name) }

func (f *fixture) loadKey(name string) crypto.Signer {
	f.t.Helper()
	k, err := signing.LoadPrivateKey(f.path(name))
	if err != nil {
		f.t.Fatal(err)
	}
	return k
}

// write puts a file in place whole, as a host's provisioning does: the
// worker retries every 50ms here, and a file read between its creation and
// its write would be an empty record, whose digest the invitation refuses.
func (f *fixture) write(name, content string, perm os.FileMode) {
	f.t.Helper()
	if err := atomicfile.Write(f.path(name), []byte(content), perm); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Chmod(f.path(name), perm); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) writeJSON(name string, v any) {
	f.t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		f.t.Fatal(err)
	}
	f.write(name, string(raw), 0o644)
}

func (f *fixture) evidence() string {
	f.t.Helper()
	sum, err := join.EvidenceOf(f.cfg.IdentityRecord)
	if err != nil {
		f.t.Fatal(err)
	}
	return sum
}

// invitation is a valid invitation payload for the box, which a test may
// then spoil.
func (f *fixture) invitation() events.Invitation {
	return events.Invitation{
		V: 1, Deployment: f.cfg.Deployment, Box: f.cfg.Box, Enrollment: "enr-1",
		EvidenceSHA256: f.evidence(), IssuedAt: issued.Format(time.RFC3339),
	}
}

func (f *fixture) sign(inv events.Invitation) events.InvitationWritten {
	f.t.Helper()
	data, err := join.SignInvitation(f.console, inv)
	if err != nil {
		f.t.Fatal(err)
	}
	return data
}

func (f *fixture) floor(version string) events.HostFloorPublished {
	f.t.Helper()
	data, err := join.SignHostFloor(f.release, events.HostFloor{
		V: 1, Deployment: f.cfg.Deployment, MinAgentVersion: version,
		Binaries: []string{strings.Repeat("ab", 32)},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return data
}

func (f *fixture) worker() *join.Worker {
	f.t.Helper()
	w, err := join.New(f.cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { w.Close() })
	return w
}

// fastRetries makes a retried event come back in milliseconds.
func fastRetries() []workers.Option {
	return []workers.Option{
		workers.WithMaxBackoff(20 * time.Millisecond),
	}
}

func (f *fixture) start(js jetstream.JetStream, opts ...workers.Option) (*join.Worker, *workertest.Running) {
	f.t.Helper()
	w := f.worker()
	return w, workertest.Start(f.t, js, w.Spec(), w, append(fastRetries(), opts...)...)
}

// handled records what the worker's handler returned, by event id: the
// error a refusal or a retry carries is what the runtime logs, and a test
// reads it here rather than from log lines.
type handled struct {
	invitations atomic.Int64
	mu          sync.Mutex
	errs        map[string][]error
}

// of returns the handler's results for one event, one per delivery (nil
// for a delivery that applied).
func (h *handled) of(id string) []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]error(nil), h.errs[id]...)
}

// startRecording runs the worker behind a handler that counts the
// deliveries of invitations and records every result.
func (f *fixture) startRecording(js jetstream.JetStream, opts ...workers.Option) (*handled, *workertest.Running) {
	f.t.Helper()
	w := f.worker()
	h := &handled{errs: map[string][]error{}}
	recorded := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if d.Event.Type() == events.TypeInvitationWritten {
			h.invitations.Add(1)
		}
		err := w.Handle(ctx, d)
		h.mu.Lock()
		h.errs[d.Event.ID()] = append(h.errs[d.Event.ID()], err)
		h.mu.Unlock()
		return err
	})
	return h, workertest.Start(f.t, js, w.Spec(), recorded, append(fastRetries(), opts...)...)
}

// startCounting runs the worker behind a handler that counts the
// deliveries of invitations.
func (f *fixture) startCounting(js jetstream.JetStream, opts ...workers.Option) (*atomic.Int64, *workertest.Running) {
	f.t.Helper()
	h, r := f.startRecording(js, opts...)
	return &h.invitations, r
}

func (f *fixture) publishInvitation(js jetstream.JetStream, data events.InvitationWritten) publisher.Ack {
	f.t.Helper()
	return workertest.PublishData(f.t, js, events.TypeInvitationWritten, data.Box, data)
}

func (f *fixture) publishFloor(js jetstream.JetStream, data events.HostFloorPublished) publisher.Ack {
	f.t.Helper()
	return workertest.PublishData(f.t, js, events.TypeHostFloorPublished, data.Deployment, data)
}

// assertRefused checks that the handler refused the event once, as a
// policy refusal (settled, never retried), with an error that names the
// rule, the event and the box and says what follows.
func assertRefused(t *testing.T, h *handled, ack publisher.Ack, box string, wants ...string) {
	t.Helper()
	errs := h.of(ack.ID)
	if len(errs) != 1 {
		t.Fatalf("event %s was handled %d times (%v), want once: a refusal is never retried", ack.ID, len(errs), errs)
	}
	err := errs[0]
	if !workers.IsRefused(err) || workers.IsPermanent(err) || !errors.Is(err, join.ErrRefused) {
		t.Fatalf("event %s: the handler returned %v, want a workers.Refused wrapping join.ErrRefused", ack.ID, err)
	}
	for _, want := range append([]string{ack.ID, box}, wants...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}

// assertNoDeadLetters checks that nothing of the instance is in the DLQ.
func assertNoDeadLetters(t *testing.T, js jetstream.JetStream, instance string) {
	t.Helper()
	if dls := workertest.DeadLetters(t, js, join.Name, instance); len(dls) != 0 {
		t.Fatalf("%d dead letters of %s, the first: %q", len(dls), instance, dls[0].Reason)
	}
}

// armRuns counts the arm command's runs.
func (f *fixture) armRuns() int {
	f.t.Helper()
	raw, err := os.ReadFile(f.path("arm.log"))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return strings.Count(string(raw), "\n")
}

// optTree lists everything under the opt dir.
func (f *fixture) optTree() []string {
	f.t.Helper()
	var out []string
	err := filepath.WalkDir(f.cfg.OptDir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != f.cfg.OptDir {
			out = append(out, strings.TrimPrefix(p, f.cfg.OptDir))
		}
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) assertOptEmpty() {
	f.t.Helper()
	if tree := f.optTree(); len(tree) != 0 {
		f.t.Fatalf("the opt dir holds %v; nothing should have been written", tree)
	}
	if _, err := os.Stat(f.cfg.ArmedMarker); !os.IsNotExist(err) {
		f.t.Fatalf("the armed marker exists (%v); the guard should not have been armed", err)
	}
}

// outcomes returns the data of the worker's own outcomes of one kind, read
// with workertest's finder and decoded as join emits them (string fields
// only, so a field of another type fails the test). The runtime's
// superseded outcomes (a queued event settled because a newer one of its
// key was behind it, with supersededBy) share the type of join's
// superseded (an invitation older than the accepted one) and are left out.
func outcomes(t *testing.T, js jetstream.JetStream, instance, outcome string) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, e := range workertest.Outcomes(t, js, join.Name, instance) {
		if workertest.OutcomeName(e) != outcome {
			continue
		}
		if outcome == events.OutcomeSuperseded {
			if by := workertest.DataAs[events.Superseded](t, e, e.Type()); by.SupersededBy != "" {
				continue
			}
		}
		out = append(out, workertest.DataAs[map[string]string](t, e, events.OutcomeType(join.Name, outcome)))
	}
	return out
}

func waitOutcomes(t *testing.T, js jetstream.JetStream, instance, outcome string, n int) []map[string]string {
	t.Helper()
	var got []map[string]string
	changed := storedChanged(js, events.StreamOutcomes, events.OutcomesPrefix+"."+join.Name+"."+instance)
	workertest.WaitUntil(t, "join."+outcome+" outcomes of "+instance+" reach "+strconv.Itoa(n), func() bool {
		if !changed() {
			return false
		}
		got = outcomes(t, js, instance, outcome)
		return len(got) >= n
	})
	if len(got) != n {
		t.Fatalf("%d join.%s outcomes, want %d: %v", len(got), outcome, n, got)
	}
	return got
}

// storedChanged reports whether the count of messages stored on a subject
// changed since it last looked (true the first time). Reading a stream
// creates a consumer, so waits read only when there is something new.
func storedChanged(js jetstream.JetStream, stream, subject string) func() bool {
	last := int64(-1)
	return func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return false
		}
		n := int64(info.State.Subjects[subject])
		if n == last {
			return false
		}
		last = n
		return true
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// keptFloorView is the kept floor document with its envelope's payload
// read (not verified: the test only looks at what is kept).
type keptFloorView struct {
	join.KeptFloor
	Floor events.HostFloor
}

func stateFloor(t *testing.T, r *workertest.Running) keptFloorView {
	t.Helper()
	var kept keptFloorView
	if _, err := r.State().Get(context.Background(), "floor", &kept.KeptFloor); err != nil {
		t.Fatal(err)
	}
	if kept.Envelope == nil {
		t.Fatalf("the kept floor %+v holds no envelope", kept.KeptFloor)
	}
	payload, err := kept.Envelope.DecodeB64Payload()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(payload, &kept.Floor); err != nil {
		t.Fatal(err)
	}
	return kept
}

// waitDeadLetters waits for n dead letters of the instance. Tests wait for
// what they expect before WaitIdle: right after a publish the consumer's
// pending count may not include the new event yet.
func waitDeadLetters(t *testing.T, js jetstream.JetStream, instance string, n int) []events.DeadLetter {
	t.Helper()
	var got []events.DeadLetter
	changed := storedChanged(js, events.StreamDLQ, events.DLQPrefix+"."+join.Name+"."+instance)
	workertest.WaitUntil(t, "dead letters of "+instance+" reach "+strconv.Itoa(n), func() bool {
		if !changed() {
			return false
		}
		got = workertest.DeadLetters(t, js, join.Name, instance)
		return len(got) >= n
	})
	return got
}
