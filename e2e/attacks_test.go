package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/workertest"
)

// The attacks of docs/design.md §7 against real processes: steward dev,
// a stream-reading credential worker beside it, and a box's credentials
// issued with steward creds issue, as an operator issues them. The box has
// the server store documents it shaped under the other instances' keys
// (NATS never checks a reply subject). Each attack is one the issue found
// working before documents carried their writer's proof: skip (a
// checkpoint claiming every event applied), hold off (a pause until 2099,
// an installed version far ahead, a cursor past the stream's end) and roll
// back (an installed version and a checkpoint put back below what was
// applied). Every victim must go on as if nothing had been stored, and the
// operator's status must show each forgery with the key it came from.
func TestABoxCannotHoldOffSkipPauseOrRollBackAnotherInstance(t *testing.T) {
	dir := t.TempDir()
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", workertest.FreePort(t))
	dev := newProc(t, "steward-dev", bins.steward, []string{"dev", "--dir", dir,
		"--nats-listen", strings.TrimPrefix(natsURL, "nats://"), "--http-listen", fmt.Sprintf("127.0.0.1:%d", workertest.FreePort(t))}, nil)
	dev.start()
	waitFor(t, "steward dev is running", 2*time.Minute, func() (bool, string) {
		if gone, err := dev.exited(); gone {
			t.Fatalf("steward dev exited: %v\n%s", err, dev.tail(40))
		}
		return strings.Contains(dev.tail(200), "steward dev is running"), "not yet"
	})
	creds := filepath.Join(dir, "creds")
	opCreds := filepath.Join(creds, "operator.creds")
	op := connectAs(t, natsURL, opCreds)
	asOperator := map[string]string{"STEWARD_NATS_URL": natsURL, "STEWARD_NATS_CREDS": opCreds}
	asPublisher := map[string]string{"STEWARD_NATS_URL": natsURL, "STEWARD_NATS_CREDS": filepath.Join(creds, "publisher.creds")}

	// Identities issued the way users issue them: the attacking box, and a
	// hive at a site that reads its subjects straight from the stream.
	issued := t.TempDir()
	issue := func(worker, instance string) string {
		out := filepath.Join(issued, worker+"-"+instance+".creds")
		runSteward(t, nil, "creds", "issue", worker, instance, "--account-seed", filepath.Join(dir, "nats-auth", "signing.nk"), "--out", out)
		return out
	}
	boxCreds := issue("join", "box-9")
	hive := "site-hive"
	keys := t.TempDir()
	hivePub := makeKey(t, keys, "age", "hive")
	credDir := filepath.Join(t.TempDir(), "credentials")
	startWorker(t, "credential", map[string]string{
		"STEWARD_NATS_URL": natsURL, "STEWARD_NATS_CREDS": issue("credential", hive), "STEWARD_READ_MODE": "stream",
		"STEWARD_HIVE": hive, "STEWARD_AGE_IDENTITY": filepath.Join(keys, "hive.key"), "STEWARD_CREDENTIAL_DIR": credDir,
		"STEWARD_CONTROLLER_KEY": filepath.Join(dir, "controller.pub"),
	})
	secret := filepath.Join(t.TempDir(), "secret.txt")
	if err := os.WriteFile(secret, []byte("site-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	rotate := func(id string, version int) answer {
		runSteward(t, asPublisher, "publish", "--id", id, "--type", events.TypeCredentialRotated,
			"--data", fmt.Sprintf(`{"hive":%q,"version":%d,"clientId":"site-client-%d"}`, hive, version, version),
			"--secret-file", secret, "--recipient", hivePub, "--signing-key", filepath.Join(dir, "controller.key"))
		return answer{credentialWorker, hive, id}
	}
	release := func(id, version string) answer {
		runSteward(t, asPublisher, "publish", "--id", id, "--type", events.TypeReleasePublished, "--data", fmt.Sprintf(`{"version":%q}`, version))
		return answer{converge.Name, converge.DevInstall, id}
	}
	installed := events.StateKey(converge.Name, converge.DevInstall, converge.InstalledDoc)
	checkpoint := events.CheckpointKey(credentialWorker, hive, events.TypeCredentialRotated, hive)
	rotated, _ := events.Lookup(events.TypeCredentialRotated)
	subject, err := rotated.SubjectFor(hive)
	if err != nil {
		t.Fatal(err)
	}
	cursor, err := json.Marshal(events.Cursor{Subjects: map[string]uint64{subject: 1_000_000_000}})
	if err != nil {
		t.Fatal(err)
	}

	// Skip, pause and hold off: the next genuine rotation and release
	// apply all the same.
	attacks := reflectAsBox(t, op, boxCreds, "box-9", map[string]string{
		checkpoint:                               `{"applied":1000000000}`,
		events.PauseKey(credentialWorker, hive):  `{"until":"2099-01-01T00:00:00Z"}`,
		events.CursorKey(credentialWorker, hive): string(cursor),
		installed:                                `{"version":"9.0.0"}`,
	})
	op.wantOutcome(t, rotate("rotation-1", 1), "dev.steward.credential.applied.v1")
	if raw, err := os.ReadFile(filepath.Join(credDir, "client_id")); err != nil || strings.TrimSpace(string(raw)) != "site-client-1" {
		t.Fatalf("after the forgeries, client_id %q (%v); want rotation 1 applied", raw, err)
	}
	op.wantOutcome(t, release("release-1.1.0", "1.1.0"), "dev.steward.converge.succeeded.v1")

	// Roll back: documents put back below what was applied move nothing.
	// The same rotation and release again are no step back to take.
	attacks += reflectAsBox(t, op, boxCreds, "box-9", map[string]string{
		checkpoint: `{"applied":0}`,
		installed:  `{"version":"1.0.0"}`,
	})
	op.wantOutcome(t, rotate("rotation-1-again", 1), "dev.steward.credential.skipped.v1")
	op.wantOutcome(t, release("release-1.1.0-again", "1.1.0"), "dev.steward.converge.refused.v1")
	op.wantOutcome(t, release("release-1.2.0", "1.2.0"), "dev.steward.converge.succeeded.v1")

	// The operator sees each forgery, and the box's key it came from.
	var shown string
	waitFor(t, "steward status shows the forgeries reflected from the box's key", time.Minute, func() (bool, string) {
		shown = runSteward(t, asOperator, "status", "--json")
		for _, key := range []string{checkpoint, installed, events.PauseKey(credentialWorker, hive)} {
			if !strings.Contains(shown, key) {
				return false, "no forgery under " + key
			}
		}
		return strings.Contains(shown, "cp.join.box-9.forged"), "no reflecting key"
	})
	// Every check above is fatal, so reaching here means each forgery
	// that landed was withstood.
	summary(t, "reflection-attacks", "forgeries_landed", attacks, "withstood", attacks)
}

// credentialWorker is the credential worker's name.
const credentialWorker = "credential"

// answer names an event a worker instance must answer.
type answer struct{ worker, instance, id string }

// connectAs connects to url with a credentials file and the inbox prefix
// its JWT allows.
func connectAs(t *testing.T, url, creds string) *bus {
	t.Helper()
	raw, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.UserCredentials(creds)}
	if prefix := natsauth.CredsInboxPrefix(raw); prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	return connect(t, url, opts...)
}

// wantOutcome waits for e's outcome and fails unless it is of type want.
func (b *bus) wantOutcome(t *testing.T, e answer, want string) {
	t.Helper()
	if o := waitOutcome(t, b, e.worker, e.instance, e.id, time.Minute); o.Type() != want {
		t.Fatalf("event %s for %s-%s: outcome %s (%s); want %s", e.id, e.worker, e.instance, o.Type(), o.Data(), want)
	}
}

// reflectAsBox connects with the box's credentials and has the server
// store, under each victim key, the document the box shaped for it: it
// stores the document under its own key, then asks for a direct get of it
// with the victim's key as the reply subject. NATS never checks a reply
// subject; the bucket stores the answer. It returns how many landed, as
// the operator's connection op reads them back.
func reflectAsBox(t *testing.T, op *bus, creds, box string, forged map[string]string) int {
	t.Helper()
	attacker := connectAs(t, op.nc.ConnectedUrl(), creds)
	kv := "$KV." + events.CheckpointBucket + "."
	own := "cp.join." + box + ".forged"
	bucket, err := op.js.KeyValue(context.Background(), events.CheckpointBucket)
	if err != nil {
		t.Fatal(err)
	}
	landed := 0
	for key, doc := range forged {
		if _, err := attacker.js.Publish(context.Background(), kv+own, []byte(doc)); err != nil {
			t.Fatalf("the box may write its own key: %v", err)
		}
		reflect := func() {
			if err := attacker.nc.PublishRequest("$JS.API.DIRECT.GET.KV_"+events.CheckpointBucket+"."+kv+own, kv+key, nil); err != nil {
				t.Fatal(err)
			}
		}
		reflect()
		waitFor(t, "the forged document under "+key+" is stored", 10*time.Second, func() (bool, string) {
			e, err := bucket.Get(context.Background(), key)
			if err == nil && string(e.Value()) == doc {
				return true, ""
			}
			// On a replicated bucket a replica that does not hold the
			// box's own write yet may answer the direct get, and its
			// empty answer is what lands: an attacker sends it again.
			reflect()
			if err != nil {
				return false, err.Error()
			}
			return false, string(e.Value())
		})
		landed++
		t.Logf("the box reflected %s into %s", doc, key)
	}
	return landed
}
