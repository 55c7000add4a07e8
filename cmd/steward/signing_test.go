package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// lastStored decodes the newest event stored on subject.
func lastStored[T any](t *testing.T, js jetstream.JetStream, subject string) (T, bool) {
	t.Helper()
	var v T
	s, err := js.Stream(context.Background(), events.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), subject)
	if err != nil {
		return v, false
	}
	e, err := events.Decode(m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.DataAs(&v); err != nil {
		t.Fatal(err)
	}
	return v, true
}

func controllerPair(t *testing.T) (priv string, keys *signing.KeySet) {
	t.Helper()
	dir := t.TempDir()
	r := ok(t, nil, "keys", "--dir", dir, "--kind", "controller")
	if !strings.Contains(r.stdout, "controller.key") {
		t.Fatalf("keys --kind controller said %q", r.stdout)
	}
	keys, err := signing.LoadEnvelopeKeys(filepath.Join(dir, "controller.pub"))
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "controller.key"), keys
}

// TestPublishSigningKeySigns: `steward publish --signing-key` stores a
// rotation whose envelope verifies with the controller's public key and
// binds the version; without the key the event goes out unsigned, with a
// warning that its worker refuses it.
func TestPublishSigningKeySigns(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	priv, keys := controllerPair(t)
	recipient, err := agekey.Generate(filepath.Join(t.TempDir(), "hive.key"))
	if err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(t.TempDir(), "s")
	os.WriteFile(secretFile, []byte("never-in-the-clear"), 0o600)
	ok(t, nil, "publish", url, "--type", events.TypeCredentialRotated, "--data", `{"hive":"hive-1","version":7,"clientId":"client-7"}`,
		"--secret-file", secretFile, "--recipient", recipient, "--signing-key", priv)
	got, found := lastStored[events.CredentialRotated](t, js, "steward.events.credential.rotated.hive-1")
	if !found {
		t.Fatal("nothing stored")
	}
	p, err := signing.OpenRotation(keys, got)
	if err != nil || p.Version != 7 || p.Hive != "hive-1" {
		t.Fatalf("the stored rotation does not verify: %+v %v", p, err)
	}

	r := ok(t, nil, "publish", url, "--type", events.TypeGrantChanged, "--data", `{"machine":"m1","requirement":"postgres","generation":1,"given":[]}`)
	if !strings.Contains(r.stderr, "published unsigned (no --signing-key); its worker refuses it") {
		t.Fatalf("no warning for an unsigned grant: %q", r.stderr)
	}
	if r := run(t, nil, "publish", url, "--type", events.TypeGrantChanged, "--data", `{"machine":"m1","requirement":"postgres","generation":2,"given":[]}`, "--signing-key", secretFile); r.code == 0 || !strings.Contains(r.stderr, "--signing-key") || strings.Contains(r.stderr, "never-in-the-clear") {
		t.Fatalf("a signing key that is no key: exit %d, %q", r.code, r.stderr)
	}
}
