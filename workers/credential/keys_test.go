package credential_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// ageTool finds a binary of Debian's age package, failing (not skipping)
// when it is missing, so CI cannot pass without the interoperability check.
func ageTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: install Debian's age package (apt-get install -y age) to run the interoperability test", name)
	}
	return path
}

// TestAgeCommandLineInterop: a secret the age tool encrypts to the worker's
// recipient is applied, and an identity age-keygen makes is one New loads.
// (agekey's tests cover the other direction.)
func TestAgeCommandLineInterop(t *testing.T) {
	ageBin := ageTool(t, "age")
	keygen := ageTool(t, "age-keygen")
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	h := newHive(t, js, "hive-cli")
	h.start(h.w.Spec())

	secret := "s3cr3t-from-the-age-cli-" + randomHex(t)
	h.secrets = append(h.secrets, []byte(secret))
	cmd := exec.Command(ageBin, "-r", h.recipient, "-a")
	cmd.Stdin = strings.NewReader(secret)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	ciphertext, err := cmd.Output()
	if err != nil {
		t.Fatalf("age -r %s -a: %v: %s", h.recipient, err, stderr.String())
	}
	h.publish(1, "client-cli", string(ciphertext))
	got := h.waitOutcomes(1)
	workertest.DataAs[credential.Applied](t, got[0], typeApplied)
	h.checkPair("client-cli", secret)

	// age-keygen's identity file is one New accepts.
	idPath := filepath.Join(t.TempDir(), "keygen.txt")
	if out, err := exec.Command(keygen, "-o", idPath).CombinedOutput(); err != nil {
		t.Fatalf("age-keygen: %v: %s", err, out)
	}
	dir := t.TempDir()
	if _, err := credential.New(credential.Config{Hive: "hive-kg", AgeIdentity: idPath, CredentialDir: dir, ControllerKey: controllerPub}); err != nil {
		t.Fatalf("New with an age-keygen identity: %v", err)
	}
	h.assertNoSecret()
}

func TestNewChecksConfig(t *testing.T) {
	base := t.TempDir()
	good := filepath.Join(base, "id.txt")
	if _, err := agekey.Generate(good); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(base, "garbage.txt")
	os.WriteFile(garbage, []byte("AGE-SECRET-KEY-1NOTAREALKEYBUTSECRETLOOKING\n"), 0o600)
	empty := filepath.Join(base, "empty.txt")
	os.WriteFile(empty, []byte("# nothing\n"), 0o600)
	dir := filepath.Join(base, "files")
	cases := []struct {
		name string
		cfg  credential.Config
		want string
	}{
		{"no hive", credential.Config{AgeIdentity: good, CredentialDir: dir}, "--hive"},
		{"hive with a dot", credential.Config{Hive: "a.b", AgeIdentity: good, CredentialDir: dir}, "--hive"},
		{"hive with a slash", credential.Config{Hive: "../x", AgeIdentity: good, CredentialDir: dir}, "--hive"},
		{"no identity", credential.Config{Hive: "h", CredentialDir: dir}, "--age-identity"},
		{"missing identity", credential.Config{Hive: "h", AgeIdentity: filepath.Join(base, "nope"), CredentialDir: dir}, "--age-identity"},
		{"garbage identity", credential.Config{Hive: "h", AgeIdentity: garbage, CredentialDir: dir}, "--age-identity"},
		{"identity without keys", credential.Config{Hive: "h", AgeIdentity: empty, CredentialDir: dir}, "--age-identity"},
		{"no credential dir", credential.Config{Hive: "h", AgeIdentity: good}, "--credential-dir"},
	}
	for _, c := range cases {
		_, err := credential.New(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "NOTAREALKEY") {
			t.Errorf("%s: the error quotes the identity file", c.name)
		}
	}
	// The credential directory may appear later (a mount): New accepts it.
	w, err := credential.New(credential.Config{Hive: "h", AgeIdentity: good, CredentialDir: dir, ControllerKey: controllerPub})
	if err != nil {
		t.Fatal(err)
	}
	spec := w.Spec()
	if spec.Name != "credential" || spec.Instance != "h" || len(spec.Subjects) != 1 || spec.Subjects[0] != "steward.events.credential.rotated.h" ||
		len(spec.Types) != 1 || spec.Types[0] != events.TypeCredentialRotated {
		t.Fatalf("spec %+v", spec)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDevPreparesARotationANewcomerCanPublish follows the printed
// instructions: the recipient and the secret file they name make an event
// the development worker applies.
func TestDevPreparesARotationANewcomerCanPublish(t *testing.T) {
	dir := t.TempDir()
	cfg, lines, err := credential.Dev(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg2, lines2, err := credential.Dev(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg != cfg2 || strings.Join(lines, "\n") != strings.Join(lines2, "\n") {
		t.Fatal("a second Dev made a different worker: the identity was not reused")
	}
	if cfg.Hive != "dev-hive" || cfg.AgeIdentity != filepath.Join(dir, "credential", "identity.txt") || cfg.CredentialDir != filepath.Join(dir, "credential", "files") {
		t.Fatalf("dev config %+v", cfg)
	}
	text := strings.Join(lines, "\n")
	m := regexp.MustCompile(`go run ./cmd/steward publish --type dev\.steward\.credential\.rotated\.v1 --data '(\{[^']+\})' --secret-file (\S+) --recipient (age1[0-9a-z]+) --signing-key (\S+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no publish line in:\n%s", text)
	}
	secret, err := os.ReadFile(m[2])
	if err != nil {
		t.Fatalf("the secret file the line names: %v", err)
	}
	if fi, _ := os.Stat(m[2]); fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev secret file mode %v", fi.Mode().Perm())
	}

	// Do what the cmd engineer's publish does with --secret-file and
	// --recipient, then run the dev worker on it.
	ciphertext, err := agekey.Encrypt(m[3], secret)
	if err != nil {
		t.Fatal(err)
	}
	var rot events.CredentialRotated
	if err := json.Unmarshal([]byte(strings.TrimSuffix(m[1], "}")+`,"secret":`+jsonString(ciphertext)+"}"), &rot); err != nil {
		t.Fatal(err)
	}
	// --signing-key: the line's key signs, and the dev worker verifies
	// with its public half.
	rot = signedWith(t, m[4], rot)
	w, err := credential.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	r := workertest.Start(t, js, w.Spec(), w)
	workertest.PublishData(t, js, events.TypeCredentialRotated, cfg.Hive, rot)
	workertest.WaitIdle(t, js, r.ConsumerName())
	got, err := os.ReadFile(filepath.Join(cfg.CredentialDir, credential.SecretFile))
	if err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the dev rotation was not applied: %v", err)
	}
	if c, _ := os.ReadFile(filepath.Join(cfg.CredentialDir, credential.ClientIDFile)); string(c) != "dev-client" {
		t.Fatalf("client_id %q", c)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
