package converge

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

const (
	testInstall = "shop"
	testProject = "steward-test"
	testRegion  = "europe-west1"
	testJob     = "shop-ops"
	testSA      = "ops@steward-test.iam.gserviceaccount.com"
	testAdmin   = "group:ops-admins@example.com"
	testJobName = "projects/" + testProject + "/locations/" + testRegion + "/jobs/" + testJob
)

// keyPair is a release key on disk, as operators hold it.
type keyPair struct {
	signer  crypto.Signer
	pubPath string
}

func newKeyPair(t *testing.T, kind signing.KeyKind) keyPair {
	t.Helper()
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "cosign.key"), filepath.Join(dir, "cosign.pub")
	if err := signing.GenerateKeyPair(kind, priv, pub); err != nil {
		t.Fatal(err)
	}
	s, err := signing.LoadPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return keyPair{signer: s, pubPath: pub}
}

func image(tag string) string {
	sum := sha256.Sum256([]byte(tag))
	return "europe-docker.pkg.dev/steward-test/ops/shop-ops@sha256:" + hex.EncodeToString(sum[:])
}

func manifest(version, minFrom string) Manifest {
	return Manifest{Schema: ManifestSchema, Version: version, MinFromVersion: minFrom, OpsImage: image(version), PublishedAt: "2026-03-01T12:00:00Z"}
}

func writeRelease(t *testing.T, reg string, key keyPair, m Manifest) {
	t.Helper()
	if err := WriteRelease(reg, key.signer, m); err != nil {
		t.Fatal(err)
	}
}

// verifiedRelease is the release of version as the registry reg holds it,
// signed by key, and the digest of its manifest once verified: what an
// attacker can copy from the registry into a forged stage.
func verifiedRelease(t *testing.T, reg string, key keyPair, version string) (Evidence, string) {
	t.Helper()
	evidence, err := dirRegistry{root: reg}.fetch(context.Background(), version)
	if err != nil {
		t.Fatal(err)
	}
	_, digest, err := verifyEvidence(newReleaseKeys(mustKey(t, key)), version, evidence)
	if err != nil {
		t.Fatal(err)
	}
	return evidence, digest
}

func cloudRunConfig(reg string, key keyPair, fake *cloudrunfake.Server) Config {
	return Config{
		Install:                testInstall,
		Registry:               reg,
		ReleaseKey:             key.pubPath,
		InstalledVersion:       "1.0.0",
		Runner:                 RunnerCloudRun,
		TaskTimeout:            45 * time.Minute,
		CloudRunProject:        testProject,
		CloudRunRegion:         testRegion,
		CloudRunJob:            testJob,
		CloudRunServiceAccount: testSA,
		CloudRunAdminMember:    testAdmin,
		CloudRunNetwork:        "ops-net",
		CloudRunSubnet:         "ops-subnet",
		CloudRunEndpoint:       fake.Endpoint(),
		pollInterval:           20 * time.Millisecond,
	}
}

func fastRetries() workers.Option {
	return workers.WithMaxBackoff(50 * time.Millisecond)
}

// startWorker builds a converge worker from cfg and runs it; both end with
// the test.
func startWorker(t *testing.T, js jetstream.JetStream, cfg Config, opts ...workers.Option) (*Worker, *workertest.Running) {
	t.Helper()
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	opts = append([]workers.Option{fastRetries()}, opts...)
	return w, workertest.Start(t, js, w.Spec(), w, opts...)
}

func publishRelease(t *testing.T, js jetstream.JetStream, version, digest string) string {
	t.Helper()
	return publishReleaseID(t, js, "", version, digest)
}

func publishReleaseID(t *testing.T, js jetstream.JetStream, id, version, digest string) string {
	t.Helper()
	e, err := events.New(events.TypeReleasePublished, version, events.ReleasePublished{Version: version, ManifestDigest: digest})
	if err != nil {
		t.Fatal(err)
	}
	if id != "" {
		e.SetID(id)
	}
	workertest.Publish(t, js, e)
	return e.ID()
}

// recorded is the installed version a converge recorded, "" if none (the
// seed written from --installed-version is no record).
func recorded(t *testing.T, r *workertest.Running) string {
	t.Helper()
	var doc Installed
	rev, err := r.State().Get(context.Background(), InstalledDoc, &doc)
	if err != nil {
		t.Fatal(err)
	}
	if rev == 0 || doc.Seed {
		return ""
	}
	return doc.Version
}

// noDeadLetters fails the test if the worker dead-lettered anything once
// it is idle: refusals and failed executions are settled, never DLQ'd.
func noDeadLetters(t *testing.T, js jetstream.JetStream, r *workertest.Running) {
	t.Helper()
	workertest.WaitIdle(t, js, r.ConsumerName())
	if dls := workertest.DeadLetters(t, js, Name, testInstall); len(dls) != 0 {
		t.Fatalf("%d dead letters, want none: the first says %q", len(dls), dls[0].Reason)
	}
}

func waitOutcomes(t *testing.T, js jetstream.JetStream, n int) []event.Event {
	t.Helper()
	var got []event.Event
	workertest.WaitUntil(t, "converge has emitted outcomes", func() bool {
		got = workertest.Outcomes(t, js, Name, testInstall)
		return len(got) >= n
	})
	if len(got) != n {
		t.Fatalf("%d outcomes, want %d: %v", len(got), n, types(got))
	}
	return got
}

func types(list []event.Event) []string {
	var out []string
	for _, e := range list {
		out = append(out, e.Type())
	}
	return out
}

// outcomeData is workertest.DataAs (the outcome's type, then its data as
// a T) and, stricter, refuses a field T does not have, so an outcome that
// grows a field the tests do not know of fails them.
func outcomeData[T any](t *testing.T, e event.Event, outcome string) T {
	t.Helper()
	v := workertest.DataAs[T](t, e, events.OutcomeType(Name, outcome))
	dec := json.NewDecoder(strings.NewReader(string(e.Data())))
	dec.DisallowUnknownFields()
	if err := dec.Decode(new(T)); err != nil {
		t.Fatalf("outcome %s: %v", e.Data(), err)
	}
	return v
}

// mustKey loads a key pair's public key as the worker does.
func mustKey(t *testing.T, k keyPair) crypto.PublicKey {
	t.Helper()
	pub, err := signing.LoadPublicKey(k.pubPath)
	if err != nil {
		t.Fatal(err)
	}
	return pub
}
