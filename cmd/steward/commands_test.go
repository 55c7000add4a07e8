package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"filippo.io/age"
	"filippo.io/age/armor"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// TestPublishExportRoundTrip proves events published from flags, from
// --data @file and from a JSONL file come back out of export as they went
// in, that the sequence and duplicate flag are printed, and that export's
// range flags select what they say.
func TestPublishExportRoundTrip(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	dir := t.TempDir()

	r := ok(t, nil, "publish", url, "--type", events.TypeReleasePublished, "--data", `{"version":"1.2.3"}`, "--id", "rel-123", "--source", "/test")
	if !strings.Contains(r.stdout, "id=rel-123") || !strings.Contains(r.stdout, "seq=1 duplicate=false") || !strings.Contains(r.stdout, "key=1.2.3") {
		t.Fatalf("publish printed %q", r.stdout)
	}
	r = ok(t, nil, "publish", url, "--type", events.TypeReleasePublished, "--data", `{"version":"1.2.3"}`, "--id", "rel-123")
	if !strings.Contains(r.stdout, "seq=1 duplicate=true") {
		t.Fatalf("republish printed %q, want the duplicate of seq 1", r.stdout)
	}
	dataFile := filepath.Join(dir, "grant.json")
	grant := `{"machine":"m1","requirement":"postgres","generation":1,"given":[]}`
	if err := os.WriteFile(dataFile, []byte(grant), 0o644); err != nil {
		t.Fatal(err)
	}
	ok(t, nil, "publish", url, "--type", events.TypeGrantChanged, "--data", "@"+dataFile, "--id", "grant-1")

	var lines bytes.Buffer
	for i, v := range []string{"2.0.0", "2.0.1", "2.1.0"} {
		e, err := events.New(events.TypeReleasePublished, v, events.ReleasePublished{Version: v})
		if err != nil {
			t.Fatal(err)
		}
		e.SetID("file-" + string(rune('a'+i)))
		e.SetSource("/recorded")
		if err := events.WriteJSONL(&lines, e); err != nil {
			t.Fatal(err)
		}
	}
	jsonl := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(jsonl, lines.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	r = ok(t, nil, "publish", url, "--file", jsonl)
	if n := strings.Count(r.stdout, "duplicate=false"); n != 3 || !strings.Contains(r.stdout, "seq=5") {
		t.Fatalf("--file printed %q", r.stdout)
	}

	out := filepath.Join(dir, "export.jsonl")
	ok(t, nil, "export", url, "--out", out)
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := events.ReadJSONL(f)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range got {
		ids = append(ids, e.ID())
		if err := events.Validate(e); err != nil {
			t.Fatalf("exported event %s no longer validates: %v", e.ID(), err)
		}
	}
	if strings.Join(ids, ",") != "rel-123,grant-1,file-a,file-b,file-c" {
		t.Fatalf("exported ids %v", ids)
	}
	if string(got[1].Data()) != grant || got[0].Source() != "/test" || got[2].Source() != "/recorded" {
		t.Fatalf("exported data %s, sources %s %s", got[1].Data(), got[0].Source(), got[2].Source())
	}
	if fi, _ := os.Stat(out); fi.Mode().Perm() != 0o600 {
		t.Fatalf("--out mode %v", fi.Mode().Perm())
	}

	r = ok(t, nil, "export", url, "--from-seq", "3", "--limit", "2")
	if got := exportedIDs(t, r.stdout); got != "file-a,file-b" {
		t.Fatalf("--from-seq 3 --limit 2 exported %s", got)
	}
	r = ok(t, nil, "export", url, "--subject", "steward.events.grant.changed.>")
	if got := exportedIDs(t, r.stdout); got != "grant-1" {
		t.Fatalf("--subject exported %s", got)
	}
	r = ok(t, nil, "export", url, "--since", "1h")
	if got := exportedIDs(t, r.stdout); !strings.HasPrefix(got, "rel-123,") {
		t.Fatalf("--since 1h exported %s", got)
	}
	if r := run(t, nil, "export", url, "--since", "yesterday"); r.code == 0 || !strings.Contains(r.stderr, "--since") {
		t.Fatalf("bad --since: exit %d, %q", r.code, r.stderr)
	}
}

func exportedIDs(t *testing.T, out string) string {
	t.Helper()
	list, err := events.ReadJSONL(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range list {
		ids = append(ids, e.ID())
	}
	return strings.Join(ids, ",")
}

// TestPublishRefusesInvalid proves validation errors are printed as the
// validator gives them (the field and the rule) with a non-zero exit, and
// that a JSONL file with one bad event publishes nothing.
func TestPublishRefusesInvalid(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	cases := []struct {
		args []string
		want []string
	}{
		{[]string{"--type", events.TypeReleasePublished, "--data", `{"version":"1.2"}`}, []string{"/version", "pattern"}},
		{[]string{"--type", events.TypeReleasePublished, "--data", `{"version":"1.2.3","image":"x"}`}, []string{"image", "additional properties"}},
		{[]string{"--type", events.TypeCredentialRotated, "--data", `{"hive":"a.b","version":1,"clientId":"c","secret":"x"}`}, []string{"/hive", "does not match pattern"}},
		{[]string{"--type", "dev.steward.nope.v1", "--data", `{}`}, []string{"--type", "dev.steward.nope.v1"}},
		{[]string{"--type", events.TypeGrantChanged, "--data", `{"generation":1}`}, []string{"--key", "machine"}},
		{[]string{"--type", events.TypeReleasePublished, "--key", "9.9.9", "--data", `{"version":"1.2.3"}`}, []string{"subject", "9.9.9"}},
		{[]string{"--type", events.TypeReleasePublished}, []string{"--data"}},
	}
	for _, c := range cases {
		r := run(t, nil, append([]string{"publish", url}, c.args...)...)
		if r.code == 0 {
			t.Fatalf("publish %v: exit 0", c.args)
		}
		for _, w := range c.want {
			if !strings.Contains(r.stderr, w) {
				t.Fatalf("publish %v: stderr %q does not name %q", c.args, r.stderr, w)
			}
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	content := `{"specversion":"1.0","type":"` + events.TypeReleasePublished + `","source":"/t","id":"ok-1","subject":"1.0.0","datacontenttype":"application/json","data":{"version":"1.0.0"}}
{"specversion":"1.0","type":"` + events.TypeReleasePublished + `","source":"/t","id":"bad-2","subject":"1.0.1","datacontenttype":"application/json","data":{"version":"1.0.1","x":1}}
`
	if err := os.WriteFile(bad, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "publish", url, "--file", bad)
	if r.code == 0 || !strings.Contains(r.stderr, "event 2") || !strings.Contains(r.stderr, "nothing was published") {
		t.Fatalf("bad file: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := streamMsgs(t, srv.URL(), events.StreamEvents); n != 0 {
		t.Fatalf("%d events stored after refusals", n)
	}
}

func streamMsgs(t *testing.T, url, stream string) uint64 {
	t.Helper()
	_, js := connectJS(t, url)
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().State.Msgs
}

// TestEnvTwinNATSURL proves STEWARD_NATS_URL is used when --nats-url is
// not given, that the flag wins over it, and that a bad typed value in a
// twin fails naming the variable.
func TestEnvTwinNATSURL(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t)
	data := []string{"--type", events.TypeReleasePublished, "--data", `{"version":"3.0.0"}`}
	r := ok(t, []string{"STEWARD_NATS_URL=" + srv.URL()}, append([]string{"publish"}, data...)...)
	if !strings.Contains(r.stdout, "seq=1") {
		t.Fatalf("publish via STEWARD_NATS_URL printed %q", r.stdout)
	}
	r = run(t, []string{"STEWARD_NATS_URL=nats://127.0.0.1:1"}, append([]string{"publish"}, data...)...)
	if r.code == 0 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Fatalf("publish to a closed port: exit %d, %q", r.code, r.stderr)
	}
	ok(t, []string{"STEWARD_NATS_URL=nats://127.0.0.1:1"}, append([]string{"publish", "--nats-url", srv.URL()}, data...)...)
	r = run(t, []string{"STEWARD_NATS_URL=" + srv.URL(), "STEWARD_REPLICAS=many"}, "status")
	if r.code == 0 || !strings.Contains(r.stderr, "STEWARD_REPLICAS") {
		t.Fatalf("bad STEWARD_REPLICAS: exit %d, %q", r.code, r.stderr)
	}
}

// TestPublishSecret proves --secret-file and --recipient put the file's
// content in data.secret encrypted to the recipient (and only there), so
// the identity made by `steward keys` opens it.
func TestPublishSecret(t *testing.T) {
	srv := workertest.StartServer(t)
	_, js := connectJS(t, srv.URL())
	srv.JetStream(t)
	dir := t.TempDir()
	ok(t, nil, "keys", "--dir", dir, "--kind", "age", "--name", "hive-h1")
	secretFile := filepath.Join(dir, "secret.txt")
	if err := os.WriteFile(secretFile, []byte("p4ssw0rd-not-in-the-clear"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok(t, nil, "publish", "--nats-url", srv.URL(), "--type", events.TypeCredentialRotated,
		"--data", `{"hive":"h1","version":7,"clientId":"client-7"}`,
		"--secret-file", secretFile, "--recipient", filepath.Join(dir, "hive-h1.pub"))
	s, _ := js.Stream(context.Background(), events.StreamEvents)
	raw, err := s.GetMsg(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw.Data, []byte("p4ssw0rd")) {
		t.Fatal("the plaintext secret is on the bus")
	}
	e, err := events.Decode(raw.Header, raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	var data events.CredentialRotated
	if err := e.DataAs(&data); err != nil {
		t.Fatal(err)
	}
	idFile, err := os.Open(filepath.Join(dir, "hive-h1.key"))
	if err != nil {
		t.Fatal(err)
	}
	defer idFile.Close()
	ids, err := age.ParseIdentities(idFile)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := age.Decrypt(armor.NewReader(strings.NewReader(data.Secret)), ids...)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := io.ReadAll(rd)
	if string(plain) != "p4ssw0rd-not-in-the-clear" || data.Version != 7 || data.ClientID != "client-7" {
		t.Fatalf("decrypted %q, data %+v", plain, data)
	}
	r := run(t, nil, "publish", "--nats-url", srv.URL(), "--type", events.TypeCredentialRotated,
		"--data", `{"hive":"h1","version":8,"clientId":"c"}`, "--secret-file", secretFile)
	if r.code == 0 || !strings.Contains(r.stderr, "--recipient") {
		t.Fatalf("--secret-file alone: exit %d, %q", r.code, r.stderr)
	}
}

// TestKeys proves keys are written with 0600 private and 0644 public
// modes, in the formats the loaders take (the P-256 public key as cosign's
// PKIX PEM), that the age recipient printed matches the identity, and that
// nothing is overwritten.
func TestKeys(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	r := ok(t, nil, "keys", "--dir", dir)
	for _, name := range []string{"ed25519", "cosign", "age"} {
		for ext, mode := range map[string]os.FileMode{".key": 0o600, ".pub": 0o644} {
			fi, err := os.Stat(filepath.Join(dir, name+ext))
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != mode {
				t.Fatalf("%s%s mode %v, want %v", name, ext, fi.Mode().Perm(), mode)
			}
		}
	}
	pub, err := signing.LoadPublicKey(filepath.Join(dir, "cosign.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pub.(*ecdsa.PublicKey); !ok {
		t.Fatalf("cosign.pub holds %T", pub)
	}
	pem, _ := os.ReadFile(filepath.Join(dir, "cosign.pub"))
	if !strings.HasPrefix(string(pem), "-----BEGIN PUBLIC KEY-----") {
		t.Fatalf("cosign.pub is not PKIX PEM: %.40s", pem)
	}
	pub, err = signing.LoadPublicKey(filepath.Join(dir, "ed25519.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := pub.(ed25519.PublicKey); !ok {
		t.Fatalf("ed25519.pub holds %T", pub)
	}
	priv, err := signing.LoadPrivateKey(filepath.Join(dir, "ed25519.key"))
	if err != nil {
		t.Fatal(err)
	}
	env, err := signing.SignEnvelope(priv, events.PayloadTypeInvitation, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := signing.OpenEnvelope(pub, env, events.PayloadTypeInvitation); err != nil {
		t.Fatal(err)
	}
	recipient := regexp.MustCompile(`age1[0-9a-z]+`).FindString(r.stdout)
	idFile, _ := os.Open(filepath.Join(dir, "age.key"))
	defer idFile.Close()
	ids, err := age.ParseIdentities(idFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids[0].(*age.X25519Identity).Recipient().String(); got != recipient {
		t.Fatalf("printed recipient %q, identity's %q", recipient, got)
	}
	if pubRec, _ := os.ReadFile(filepath.Join(dir, "age.pub")); strings.TrimSpace(string(pubRec)) != recipient {
		t.Fatalf("age.pub holds %q", pubRec)
	}

	before, _ := os.ReadFile(filepath.Join(dir, "ed25519.key"))
	r = run(t, nil, "keys", "--dir", dir, "--kind", "ed25519")
	if r.code == 0 || !strings.Contains(r.stderr, "exists") {
		t.Fatalf("second run: exit %d, %q", r.code, r.stderr)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "ed25519.key")); !bytes.Equal(before, after) {
		t.Fatal("an existing key was overwritten")
	}
	if r := run(t, nil, "keys", "--dir", dir, "--kind", "rsa"); r.code == 0 || !strings.Contains(r.stderr, "rsa") {
		t.Fatalf("--kind rsa: exit %d, %q", r.code, r.stderr)
	}
}

// TestDLQLsShowRetryAndStatus proves dlq ls lists a dead letter with its
// sequence, worker, subject, deliveries and reason; show prints its headers
// and data; retry republishes it to its original subject, where the worker
// (fixed meanwhile) applies it, and removes it from the DLQ; retry --all
// empties a worker's DLQ; and status shows streams, consumers and DLQ depth.
func TestDLQLsShowRetryAndStatus(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	var broken atomic.Bool
	broken.Store(true)
	var applied atomic.Int32
	spec := workers.Spec{Name: "test", Instance: "one", Subjects: []string{"steward.events.credential.rotated.>"}, Types: []string{events.TypeCredentialRotated}}
	w := workertest.Start(t, js, spec, workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		if broken.Load() {
			return workers.Permanent(errors.New("the hive's folder is read-only, so nothing was written"))
		}
		applied.Add(1)
		return nil
	}))
	for i, hive := range []string{"h1", "h2", "h3"} {
		workertest.PublishData(t, js, events.TypeCredentialRotated, hive, events.CredentialRotated{
			Hive: hive, Version: uint64(i + 1), ClientID: "c", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"})
	}
	workertest.WaitIdle(t, js, w.ConsumerName())

	r := ok(t, nil, "dlq", "ls", url)
	rows := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(rows) != 4 || !strings.HasPrefix(rows[0], "SEQ") {
		t.Fatalf("dlq ls:\n%s", r.stdout)
	}
	// Different keys fail in parallel, so the DLQ order is not the events'.
	dlqSeq := map[string]string{}
	for i, row := range rows[1:] {
		f := strings.Fields(row)
		if len(f) < 6 || f[0] != strconv.Itoa(i+1) || f[1] != "test" || f[2] != "one" || f[4] != "1" || !strings.Contains(row, "the hive's folder is read-only") {
			t.Fatalf("dlq ls row %q: want seq %d, worker test, instance one, a subject, 1 delivery and the reason", row, i+1)
		}
		dlqSeq[strings.TrimPrefix(f[3], "steward.events.credential.rotated.")] = f[0]
	}
	if len(dlqSeq) != 3 || dlqSeq["h1"] == "" || dlqSeq["h2"] == "" || dlqSeq["h3"] == "" {
		t.Fatalf("dlq ls subjects %v", dlqSeq)
	}
	if r := ok(t, nil, "dlq", "ls", url, "--worker", "other"); r.stdout != "no dead letters (filters: --worker \"other\")\n" {
		t.Fatalf("dlq ls --worker other:\n%s", r.stdout)
	}

	r = ok(t, nil, "dlq", "show", url, dlqSeq["h2"])
	for _, want := range []string{"Steward-Error: the hive's folder is read-only", "Steward-Worker: test-one", "ce-type: " + events.TypeCredentialRotated, `"hive": "h2"`} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("dlq show lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := run(t, nil, "dlq", "show", url, "99"); r.code == 0 || !strings.Contains(r.stderr, "99") {
		t.Fatalf("dlq show 99: exit %d, %q", r.code, r.stderr)
	}

	r = ok(t, nil, "status", url)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`STEWARD_EVENTS\s+3\s+\d+\s+1\s+3\s+1`),
		regexp.MustCompile(`STEWARD_DLQ\s+3\s`),
		// The instance: dead letters are its state, 3 of them.
		regexp.MustCompile(`INSTANCES 1: 1 dead-letters; DEAD LETTERS 3`),
		regexp.MustCompile(`(?m)^test-one\s+dead-letters\s+yes.*\s3\s+-\s*$`),
	} {
		if !want.MatchString(r.stdout) {
			t.Fatalf("status does not match %s:\n%s", want, r.stdout)
		}
	}

	broken.Store(false)
	r = ok(t, nil, "dlq", "retry", url, dlqSeq["h1"])
	if !strings.Contains(r.stdout, "new-seq=4") {
		t.Fatalf("dlq retry printed %q", r.stdout)
	}
	workertest.WaitUntil(t, "the retried event is applied", func() bool { return applied.Load() == 1 })
	if n := len(workertest.DeadLetters(t, js, "test", "one")); n != 2 {
		t.Fatalf("%d dead letters after retrying one of 3", n)
	}
	if r := run(t, nil, "dlq", "retry", url, "--all"); r.code == 0 || !strings.Contains(r.stderr, "--worker") {
		t.Fatalf("retry --all without --worker: exit %d, %q", r.code, r.stderr)
	}
	// A dry run changes nothing, so --all needs no --yes for it.
	if r := ok(t, nil, "dlq", "retry", url, "--all", "--dry-run"); !strings.Contains(r.stderr, "would act on these 2 dead letters") {
		t.Fatalf("retry --all --dry-run: %q", r.stderr)
	}
	ok(t, nil, "dlq", "retry", url, "--all", "--worker", "test")
	workertest.WaitUntil(t, "every retried event is applied", func() bool { return applied.Load() == 3 })
	workertest.WaitIdle(t, js, w.ConsumerName())
	if n := len(workertest.DeadLetters(t, js, "test", "one")); n != 0 {
		t.Fatalf("%d dead letters after retry --all", n)
	}
	r = ok(t, nil, "status", url)
	if !regexp.MustCompile(`STEWARD_EVENTS\s+6\s`).MatchString(r.stdout) || !strings.Contains(r.stdout, "DEAD LETTERS 0") {
		t.Fatalf("status after retries:\n%s", r.stdout)
	}
}

// credentialFixture prepares a credential worker's identity, folder and
// controller key the way dev does and returns its flags.
func credentialFixture(t *testing.T) (credential.Config, []string) {
	t.Helper()
	cfg, _, err := credential.Dev(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return cfg, []string{"--hive", cfg.Hive, "--age-identity", cfg.AgeIdentity, "--credential-dir", cfg.CredentialDir, "--controller-key", cfg.ControllerKey}
}

// signingKeyOf is the private half of a fixture's controller key, which
// `steward publish --signing-key` signs rotations with.
func signingKeyOf(cfg credential.Config) string {
	return strings.TrimSuffix(cfg.ControllerKey, ".pub") + ".key"
}

func recipientOf(t *testing.T, identity string) string {
	t.Helper()
	f, err := os.Open(identity)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ids, err := age.ParseIdentities(f)
	if err != nil {
		t.Fatal(err)
	}
	return ids[0].(*age.X25519Identity).Recipient().String()
}

// TestReplay proves replay --dry-run reports and changes nothing, and that
// a replay runs the named worker's real handler over stored events.
func TestReplay(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t)
	url := "--nats-url=" + srv.URL()
	cfg, flags := credentialFixture(t)
	secretFile := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(secretFile, []byte("replayed-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok(t, nil, "publish", url, "--type", events.TypeCredentialRotated,
		"--data", `{"hive":"`+cfg.Hive+`","version":1,"clientId":"client-1"}`,
		"--secret-file", secretFile, "--recipient", recipientOf(t, cfg.AgeIdentity), "--signing-key", signingKeyOf(cfg))
	// Another hive's event is not this worker's and is not replayed.
	ok(t, nil, "publish", url, "--type", events.TypeReleasePublished, "--data", `{"version":"1.0.0"}`)

	// A dry run only decodes and validates: the instance is all it needs.
	r := ok(t, nil, "replay", "credential", url, "--from-seq", "1", "--dry-run", "--hive", cfg.Hive)
	if !strings.Contains(r.stdout, "seq=1") || !strings.Contains(r.stdout, "would be handled") || !strings.Contains(r.stdout, "1 events, 1 would be handled, 0 invalid") {
		t.Fatalf("dry run printed:\n%s", r.stdout)
	}
	if r := ok(t, nil, "replay", "converge", url, "--dry-run", "--install", "dev"); !strings.Contains(r.stdout, "dry run of converge-dev: 1 events, 1 would be handled") {
		t.Fatalf("converge dry run with only --install printed:\n%s", r.stdout)
	}
	if r := run(t, nil, "replay", "converge", url, "--dry-run"); r.code == 0 || !strings.Contains(r.stderr, "a dry run needs only --install") {
		t.Fatalf("dry run without the instance: exit %d, %q", r.code, r.stderr)
	}
	secretPath := filepath.Join(cfg.CredentialDir, credential.SecretFile)
	if _, err := os.Stat(secretPath); err == nil {
		t.Fatal("a dry run wrote the secret")
	}
	r = ok(t, nil, append([]string{"replay", "credential", url, "--since", "1h"}, flags...)...)
	if !strings.Contains(r.stdout, "seq=1") || !strings.Contains(r.stdout, "replayed 1 events through credential-"+cfg.Hive+": 1 applied, 0 failed") {
		t.Fatalf("replay printed:\n%s", r.stdout)
	}
	if got, err := os.ReadFile(secretPath); err != nil || string(got) != "replayed-secret" {
		t.Fatalf("secret after replay: %q, %v", got, err)
	}
	if r := run(t, nil, "replay", "credential", url, "--hive", cfg.Hive); r.code == 0 || !strings.Contains(r.stderr, "--age-identity") {
		t.Fatalf("replay without the worker's flags: exit %d, %q", r.code, r.stderr)
	}
}

// TestWorkerProcess runs `steward worker credential` configured only by
// environment twins, proves it applies an event, serves health and metrics
// on --http-addr, and stops with exit 0 on SIGTERM.
func TestWorkerProcess(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t)
	cfg, _ := credentialFixture(t)
	p := start(t, []string{
		"STEWARD_NATS_URL=" + srv.URL(), "STEWARD_HTTP_ADDR=127.0.0.1:0",
		"STEWARD_HIVE=" + cfg.Hive, "STEWARD_AGE_IDENTITY=" + cfg.AgeIdentity, "STEWARD_CREDENTIAL_DIR=" + cfg.CredentialDir,
		"STEWARD_CONTROLLER_KEY=" + cfg.ControllerKey,
	}, "worker", "credential")
	// The bound address is in the JSON log line that announces it.
	var addr string
	workertest.WaitUntil(t, "the worker logs its HTTP address", func() bool {
		m := workerBound.FindStringSubmatch(p.errors())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	workertest.WaitUntil(t, "the worker is ready on /readyz", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	secretFile := filepath.Join(t.TempDir(), "s")
	if err := os.WriteFile(secretFile, []byte("from-the-worker"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok(t, []string{"STEWARD_NATS_URL=" + srv.URL()}, "publish", "--type", events.TypeCredentialRotated,
		"--data", `{"hive":"`+cfg.Hive+`","version":3,"clientId":"client-3"}`,
		"--secret-file", secretFile, "--recipient", recipientOf(t, cfg.AgeIdentity), "--signing-key", signingKeyOf(cfg))
	secretPath := filepath.Join(cfg.CredentialDir, credential.SecretFile)
	workertest.WaitUntil(t, "the worker writes the secret", func() bool {
		got, err := os.ReadFile(secretPath)
		return err == nil && string(got) == "from-the-worker"
	})
	// The counter moves after the ack, a moment after the files.
	applied := regexp.MustCompile(`steward_events_total\{instance="` + cfg.Hive + `",result="applied",worker="credential"\} 1`)
	workertest.WaitUntil(t, "/metrics counts the applied event", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return applied.Match(body)
	})
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("worker exited %d after SIGTERM\n%s", code, p.errors())
	}
	if !strings.Contains(p.errors(), "worker stopped") {
		t.Fatalf("no graceful stop in the log:\n%s", p.errors())
	}
}

// TestServeProcess runs `steward serve` with --token-file and proves an
// event posted with the token is stored, and one without it is refused.
func TestServeProcess(t *testing.T) {
	srv := workertest.StartServer(t)
	srv.JetStream(t)
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte("serve-token-123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, []string{"STEWARD_NATS_URL=" + srv.URL(), "STEWARD_TOKEN_FILE=" + tokenPath}, "serve", "--listen", "127.0.0.1:0", "--max-body", "4096")
	line := p.waitLine(t, "ingress listening on ")
	url := strings.TrimPrefix(line, "ingress listening on ")
	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"version":"4.0.0"}`))
		for k, v := range map[string]string{"ce-specversion": "1.0", "ce-type": events.TypeReleasePublished, "ce-source": "/c", "ce-id": "serve-1", "ce-subject": "4.0.0", "content-type": "application/json"} {
			req.Header.Set(k, v)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d", code)
	}
	if code := post("serve-token-123"); code != http.StatusAccepted {
		t.Fatalf("with the token: %d", code)
	}
	if n := streamMsgs(t, srv.URL(), events.StreamEvents); n != 1 {
		t.Fatalf("%d events stored", n)
	}
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	if r := run(t, []string{"STEWARD_NATS_URL=" + srv.URL()}, "serve", "--listen", "127.0.0.1:0"); r.code == 0 || !strings.Contains(r.stderr, "--token") {
		t.Fatalf("serve without a token: exit %d, %q", r.code, r.stderr)
	}
}

// TestBenchCommand proves `steward bench` measures every path, the stream
// costs' too when asked, and prints the rates, both latencies, the CPU per
// event and the ratios; and that a --watermill program that is not there,
// or a --server it does not know, is refused, named, before anything is
// measured.
func TestBenchCommand(t *testing.T) {
	r := ok(t, nil, "bench", "--events", "200", "--rate", "2000", "--rounds", "1", "--stream-costs")
	if !strings.Contains(r.stdout, "publishing 200 events over 64 keys at 2000 events/s through each path, 1 round...") {
		t.Fatalf("bench counts its rounds wrong:\n%s", r.stdout)
	}
	for _, want := range []string{"runtime (no-op worker)", "raw Ack, plain stream", "raw serial DoubleAck, plain stream",
		"raw validating DoubleAck, plain stream", "raw Ack, STEWARD_EVENTS-shaped", "raw Ack, shaped, no stored notices",
		"raw Ack, shaped, no Nats-Msg-Id", "raw Ack, shaped, headers cut to the ids", "events/s", "published", "/event", "handler p50",
		"settled p50", "runtime / raw Ack throughput: ", "runtime / raw DoubleAck p99 settled: ",
		"runtime / validating raw DoubleAck p99 handler: ", "raw Ack against itself on STEWARD_EVENTS-shaped: ", "  shaped, no stored notices", " consume ", " publish ", " p99 handler ", " CPU ",
		"published as 2000 events/s"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("bench output lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := run(t, nil, "bench", "--events", "200", "--watermill", "no/such/program"); r.code == 0 ||
		!strings.Contains(r.stderr, "--watermill: external path's program no/such/program") || strings.Contains(r.stdout, "publishing") {
		t.Fatalf("bench with a missing --watermill program: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := run(t, nil, "bench", "--events", "200", "--server", "remote"); r.code == 0 ||
		!strings.Contains(r.stderr, `--server "remote": want process`) || strings.Contains(r.stdout, "publishing") {
		t.Fatalf("bench with an unknown --server: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
