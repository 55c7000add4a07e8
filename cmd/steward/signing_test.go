package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
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

// TestPublishSigningKeyRefusesAnExportedStream is the first
// attack: a publisher identity stores an unsigned grant (generation 50, a
// consumer whose password it chose); the worker refuses it; the old
// recovery procedure (export the stream, keep the newest event of each
// key, publish --file with the controller key) then had the controller
// key sign the attacker's grant. publish --signing-key --file now takes
// desired state only, so the exported stream is refused, naming the line,
// the field and the rule, and nothing is signed or stored.
func TestPublishSigningKeyRefusesAnExportedStream(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	priv, _ := controllerPair(t)
	workertest.PublishData(t, js, events.TypeGrantChanged, "db-1", events.GrantChanged{Machine: "db-1", Requirement: "postgres", Generation: 50, Given: []events.Given{}})
	exported := filepath.Join(t.TempDir(), "r.jsonl")
	ok(t, nil, "export", url, "--out", exported)
	before := streamMsgs(t, srv.URL(), events.StreamEvents)

	for _, extra := range [][]string{nil, {"--yes"}} {
		r := run(t, nil, append([]string{"publish", url, "--file", exported, "--signing-key", priv}, extra...)...)
		if r.code == 0 || !strings.Contains(r.stderr, "line 1 has field") || !strings.Contains(r.stderr, "{type, key, data} and nothing else") || !strings.Contains(r.stderr, "Nothing was signed or published") {
			t.Fatalf("publish --signing-key --file of an exported stream %v: exit %d\n%s", extra, r.code, r.stderr)
		}
	}
	// Reduced to {type, key, data} by hand, the grant still carries
	// nothing of its author's: but a copy of a signed one is refused by its
	// envelope.
	signedCopy := filepath.Join(t.TempDir(), "copy.jsonl")
	os.WriteFile(signedCopy, []byte(`{"type":"`+events.TypeGrantChanged+`","key":"db-1","data":{"machine":"db-1","requirement":"postgres","generation":51,"given":[],"envelope":{"payload":"","payloadType":"x","signatures":[]}}}`+"\n"), 0o600)
	if r := run(t, nil, "publish", url, "--file", signedCopy, "--signing-key", priv, "--yes"); r.code == 0 || !strings.Contains(r.stderr, "data has an envelope") {
		t.Fatalf("a record with an envelope: exit %d\n%s", r.code, r.stderr)
	}
	if n := streamMsgs(t, srv.URL(), events.StreamEvents); n != before {
		t.Fatalf("%d events stored after the refusals, want %d", n, before)
	}
}

// TestRepublishFromTheSourceOfTruth runs the README's recovery procedure:
// the controller keeps its desired state as {type, key, data} records
// (desired.jsonl), and republishes them signed: publish shows what the key
// would sign per key, signs nothing without --yes, and with it stores
// events that verify, superseding the attacker's unsigned grant.
func TestRepublishFromTheSourceOfTruth(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	priv, keys := controllerPair(t)
	workertest.PublishData(t, js, events.TypeGrantChanged, "db-1", events.GrantChanged{Machine: "db-1", Requirement: "postgres", Generation: 50, Given: []events.Given{}})
	before := streamMsgs(t, srv.URL(), events.StreamEvents)

	desired := filepath.Join(t.TempDir(), "desired.jsonl")
	os.WriteFile(desired, []byte(
		`{"type":"`+events.TypeGrantChanged+`","key":"db-1","data":{"machine":"db-1","requirement":"postgres","generation":4,"given":[]}}`+"\n"+
			`{"type":"`+events.TypeReleasePublished+`","key":"2.0.0","data":{"version":"2.0.0"}}`+"\n"), 0o600)
	r := run(t, nil, "publish", url, "--file", desired, "--signing-key", priv)
	if r.code == 0 || !strings.Contains(r.stdout, "grant.changed") || !strings.Contains(r.stdout, "db-1") || !strings.Contains(r.stderr, "run again with --yes") {
		t.Fatalf("without --yes: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !regexp.MustCompile(`grant\.changed\s+db-1\s+-?\s*4\s+true`).MatchString(r.stdout) {
		t.Fatalf("the summary does not show db-1 at generation 4, signed:\n%s", r.stdout)
	}
	if n := streamMsgs(t, srv.URL(), events.StreamEvents); n != before {
		t.Fatalf("%d events stored without --yes, want %d", n, before)
	}
	ok(t, nil, "publish", url, "--file", desired, "--signing-key", priv, "--yes")
	g, found := lastStored[events.GrantChanged](t, js, "steward.events.grant.changed.db-1")
	if !found {
		t.Fatal("nothing stored for db-1")
	}
	if p, err := signing.OpenGrant(keys, g); err != nil || p.Generation != 4 || p.Machine != "db-1" {
		t.Fatalf("db-1's republished grant: %+v %v", p, err)
	}
}
