package converge

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

// A release signed the way `cosign sign-blob --key` signs (ECDSA P-256,
// ASN.1 over the SHA-256 of the file, base64), made here with the standard
// library alone, verifies against a cosign.pub-style PEM key, end to end.
func TestCosignFormatSignatureConverges(t *testing.T) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPath := filepath.Join(t.TempDir(), "cosign.pub")
	mustWrite(t, pubPath, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))

	reg := t.TempDir()
	raw := []byte(`{"schema":1,"version":"1.1.0","minFromVersion":"1.0.0","opsImage":"` + image("1.1.0") + `","publishedAt":"2026-03-01T12:00:00Z"}` + "\n")
	sum := sha256.Sum256(raw)
	sig, err := ecdsa.SignASN1(rand.Reader, priv, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(reg, "1.1.0"), 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(reg, "1.1.0", ManifestFile), string(raw))
	mustWrite(t, filepath.Join(reg, "1.1.0", SignatureFile), base64.StdEncoding.EncodeToString(sig))

	fake := cloudrunfake.Start(t)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := cloudRunConfig(reg, keyPair{pubPath: pubPath}, fake)
	_, r := startWorker(t, js, cfg)
	publishRelease(t, js, "1.1.0", "sha256:"+hex.EncodeToString(sum[:]))
	got := waitOutcomes(t, js, 1)
	s := outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	if s.To != "1.1.0" || recorded(t, r) != "1.1.0" {
		t.Fatalf("succeeded %+v, recorded %q", s, recorded(t, r))
	}
	if runs := fake.RunRequests(); len(runs) != 1 {
		t.Fatalf("%d RunJob requests", len(runs))
	}
}

// An ed25519 release key works the same way.
func TestEd25519ReleaseKeyConverges(t *testing.T) {
	key := newKeyPair(t, signing.Ed25519)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	startWorker(t, js, cloudRunConfig(reg, key, fake))
	publishRelease(t, js, "1.1.0", "")
	got := waitOutcomes(t, js, 1)
	outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
}

// The same release.published replayed converges once: a duplicate id is
// dropped by the stream, and the same release published again afresh is
// refused because it is already installed. Cloud Run sees one RunJob.
func TestReplayConvergesOnce(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	fake := cloudrunfake.Start(t)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, cloudRunConfig(reg, key, fake))

	publishReleaseID(t, js, "release-1.1.0", "1.1.0", "")
	publishReleaseID(t, js, "release-1.1.0", "1.1.0", "")
	workertest.WaitIdle(t, js, r.ConsumerName())
	publishReleaseID(t, js, "release-1.1.0-again", "1.1.0", "")
	got := waitOutcomes(t, js, 2)
	outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	ref := outcomeData[Refused](t, got[1], OutcomeRefused)
	if ref.Rule != ruleSameVersion {
		t.Fatalf("replay refused %+v, want rule %s", ref, ruleSameVersion)
	}
	workertest.WaitIdle(t, js, r.ConsumerName())
	if n := len(fake.RunRequests()); n != 1 {
		t.Fatalf("%d RunJob requests for one release, want 1", n)
	}
	if v := recorded(t, r); v != "1.1.0" {
		t.Fatalf("installed version %q", v)
	}
}

func execConfig(t *testing.T, reg string, key keyPair, command string) Config {
	t.Helper()
	return Config{
		Install:          testInstall,
		Registry:         reg,
		ReleaseKey:       key.pubPath,
		InstalledVersion: "1.0.0",
		Runner:           RunnerExec,
		ExecCommand:      command,
		TaskTimeout:      time.Minute,
	}
}

// The exec runner gives the command the release and nothing of the
// worker's own settings; exit 0 converges.
func TestExecRunnerSucceeds(t *testing.T) {
	t.Setenv("STEWARD_NATS_CREDS", "/run/secrets/worker.creds")
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	out := filepath.Join(t.TempDir(), "env.txt")
	cmd := `printf '%s|%s|%s|%s|%s\n' "$STEWARD_INSTALL" "$STEWARD_FROM_VERSION" "$STEWARD_TARGET_VERSION" "$STEWARD_IMAGE" "${STEWARD_NATS_CREDS:-unset}" > ` + out
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, execConfig(t, reg, key, cmd))
	publishRelease(t, js, "1.1.0", "")
	got := waitOutcomes(t, js, 1)
	s := outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	if s.From != "1.0.0" || s.To != "1.1.0" || !strings.HasPrefix(s.Execution, "exec-") {
		t.Fatalf("succeeded %+v", s)
	}
	env, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if want := "shop|1.0.0|1.1.0|" + image("1.1.0") + "|unset\n"; string(env) != want {
		t.Fatalf("command saw %q, want %q", env, want)
	}
	if v := recorded(t, r); v != "1.1.0" {
		t.Fatalf("installed version %q", v)
	}
}

// A command that exits non-zero is a failed converge; one that outlives the
// task timeout is killed and failed too. Neither records anything, and both
// are settled with their outcome rather than dead-lettered or retried.
func TestExecRunnerFails(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	writeRelease(t, reg, key, manifest("1.1.0", "1.0.0"))
	writeRelease(t, reg, key, manifest("1.2.0", "1.0.0"))
	marker := filepath.Join(t.TempDir(), "ran")
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := execConfig(t, reg, key, `echo "$STEWARD_TARGET_VERSION" >> `+marker+`; if [ "$STEWARD_TARGET_VERSION" = 1.1.0 ]; then exit 3; fi; sleep 30`)
	cfg.TaskTimeout = time.Second
	_, r := startWorker(t, js, cfg)
	publishRelease(t, js, "1.1.0", "")
	publishRelease(t, js, "1.2.0", "")
	got := waitOutcomes(t, js, 2)
	f := outcomeData[Failed](t, got[0], OutcomeFailed)
	if f.Version != "1.1.0" || f.Condition != "the command ended with exit status 3" || !strings.HasPrefix(f.Execution, "exec-") {
		t.Fatalf("failed %+v", f)
	}
	f = outcomeData[Failed](t, got[1], OutcomeFailed)
	if f.Version != "1.2.0" || !strings.Contains(f.Condition, "killed after the task timeout of 1s") {
		t.Fatalf("failed %+v", f)
	}
	noDeadLetters(t, js, r)
	if v := recorded(t, r); v != "" {
		t.Fatalf("failed converges recorded %q", v)
	}
	if ran, _ := os.ReadFile(marker); string(ran) != "1.1.0\n1.2.0\n" {
		t.Fatalf("the command ran for %q, want once per release", ran)
	}
}

// An https registry: fetched through TLS, retried while it answers 5xx,
// a refusal when the release is not there.
func TestHTTPSRegistry(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	dir := t.TempDir()
	writeRelease(t, dir, key, manifest("1.1.0", "1.0.0"))
	var unavailable atomic.Int32
	unavailable.Store(2)
	var hits atomic.Int32
	ts := httptest.NewTLSServer(http.StripPrefix("/releases", http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		hits.Add(1)
		if unavailable.Add(-1) >= 0 {
			http.Error(w, "try later", http.StatusServiceUnavailable)
			return
		}
		http.FileServer(http.Dir(dir)).ServeHTTP(w, req)
	})))
	defer ts.Close()

	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	cfg := execConfig(t, ts.URL+"/releases/", key, "true")
	cfg.httpClient = ts.Client()
	_, r := startWorker(t, js, cfg)
	publishRelease(t, js, "1.1.0", "")
	publishRelease(t, js, "1.5.0", "")
	got := waitOutcomes(t, js, 2)
	outcomeData[Succeeded](t, got[0], OutcomeSucceeded)
	ref := outcomeData[Refused](t, got[1], OutcomeRefused)
	if ref.Rule != ruleNotFound || !strings.Contains(ref.Reason, "HTTP 404") || !strings.Contains(ref.Reason, ts.URL+"/releases") {
		t.Fatalf("refused %+v", ref)
	}
	if v := recorded(t, r); v != "1.1.0" {
		t.Fatalf("installed version %q", v)
	}
	if hits.Load() < 5 {
		t.Fatalf("%d requests; the two 503s were not retried", hits.Load())
	}

	// A registry whose certificate is not trusted is unreachable, which a
	// retry may fix, not a refusal.
	plain, err := newRegistry(ts.URL+"/releases", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = plain.fetch(context.Background(), "1.1.0")
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("untrusted certificate: %v", err)
	}
}

// New names the flag and the rule of every bad setting.
func TestConfigErrors(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	fake := cloudrunfake.Start(t)
	good := cloudRunConfig(reg, key, fake)
	notAKey := filepath.Join(t.TempDir(), "x.pem")
	mustWrite(t, notAKey, "hello")
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"install with a dot", func(c *Config) { c.Install = "shop.eu" }, "--install"},
		{"no registry", func(c *Config) { c.Registry = "" }, "--registry is required"},
		{"http registry", func(c *Config) { c.Registry = "http://registry.example/r" }, "a registry URL is https://"},
		{"registry with credentials", func(c *Config) { c.Registry = "https://u:p@registry.example/r" }, "without credentials"},
		{"missing registry dir", func(c *Config) { c.Registry = filepath.Join(reg, "nope") }, "--registry"},
		{"no key", func(c *Config) { c.ReleaseKey = "" }, "--release-key is required"},
		{"not a key", func(c *Config) { c.ReleaseKey = notAKey }, "--release-key"},
		{"bad installed version", func(c *Config) { c.InstalledVersion = "v1" }, "--installed-version"},
		{"no runner", func(c *Config) { c.Runner = "" }, "--runner is required"},
		{"unknown runner", func(c *Config) { c.Runner = "docker" }, `--runner "docker"`},
		{"exec without command", func(c *Config) { c.Runner = RunnerExec }, "--exec-command is required"},
		{"timeout too long", func(c *Config) { c.TaskTimeout = 200 * time.Hour }, "--task-timeout"},
		{"no project", func(c *Config) { c.CloudRunProject = "" }, "--cloudrun-project is required"},
		{"project path", func(c *Config) { c.CloudRunProject = "p/../../x" }, "--cloudrun-project"},
		{"region", func(c *Config) { c.CloudRunRegion = "europe/west1" }, "--cloudrun-region"},
		{"job", func(c *Config) { c.CloudRunJob = "Shop_Ops" }, "--cloudrun-job"},
		{"no service account", func(c *Config) { c.CloudRunServiceAccount = "" }, "--cloudrun-service-account is required"},
		{"admin without type", func(c *Config) { c.CloudRunAdminMember = "ops@example.com" }, "--cloudrun-admin-member"},
		{"admin allUsers", func(c *Config) { c.CloudRunAdminMember = "allUsers" }, "--cloudrun-admin-member"},
		{"subnet path trick", func(c *Config) { c.CloudRunSubnet = "../x" }, "--cloudrun-subnet"},
		{"endpoint URL", func(c *Config) { c.CloudRunEndpoint = "http://127.0.0.1:1/x" }, "--cloudrun-endpoint"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := good
			c.edit(&cfg)
			w, err := New(cfg)
			if err == nil {
				w.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not name %q", err, c.want)
			}
		})
	}
	w, err := New(good)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// Every flag is registered under its docs/design.md §6 name, with the defaults.
func TestFlags(t *testing.T) {
	var cfg Config
	fs := pflag.NewFlagSet("converge", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	err := fs.Parse([]string{
		"--install=shop", "--registry=/r", "--release-key=/k.pub", "--installed-version=1.0.0",
		"--exec-command=true", "--cloudrun-project=p", "--cloudrun-region=r", "--cloudrun-job=j",
		"--cloudrun-service-account=sa@x.iam.gserviceaccount.com", "--cloudrun-admin-member=user:a@x.com",
		"--cloudrun-network=n", "--cloudrun-subnet=s", "--cloudrun-endpoint=127.0.0.1:9",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Runner != RunnerCloudRun || cfg.TaskTimeout != DefaultTaskTimeout {
		t.Fatalf("defaults: runner %q, task timeout %v", cfg.Runner, cfg.TaskTimeout)
	}
	if cfg.Install != "shop" || cfg.CloudRunEndpoint != "127.0.0.1:9" || cfg.CloudRunSubnet != "s" || cfg.InstalledVersion != "1.0.0" {
		t.Fatalf("parsed %+v", cfg)
	}
}

// Dev prepares a working development instance, reusing what it made: its
// sample release converges through the exec runner.
func TestDev(t *testing.T) {
	dir := t.TempDir()
	cfg, lines, err := Dev(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	keyBefore, err := os.ReadFile(filepath.Join(dir, "keys", "cosign.key"))
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(dir, "keys", "cosign.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("private key mode %v, %v", st.Mode(), err)
	}
	cfg2, _, err := Dev(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	keyAfter, _ := os.ReadFile(filepath.Join(dir, "keys", "cosign.key"))
	if cfg2 != cfg || string(keyAfter) != string(keyBefore) {
		t.Fatal("a second Dev changed the instance or its key")
	}
	if cfg.Install != DevInstall || cfg.Runner != RunnerExec || cfg.InstalledVersion != "1.0.0" {
		t.Fatalf("dev config %+v", cfg)
	}
	joined := strings.Join(lines, "\n")
	if !strings.Contains(joined, `go run ./cmd/steward publish --type dev.steward.release.published.v1 --data '{"version":"1.1.0"}'`) {
		t.Fatalf("lines do not tell how to publish:\n%s", joined)
	}

	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r := workertest.Start(t, js, w.Spec(), w, fastRetries())
	publishRelease(t, js, "1.1.0", "")
	publishRelease(t, js, "1.2.0", "")
	var got []string
	workertest.WaitUntil(t, "the dev releases converge", func() bool {
		got = types(workertest.Outcomes(t, js, Name, DevInstall))
		return len(got) == 2
	})
	if got[0] != "dev.steward.converge.succeeded.v1" || got[1] != "dev.steward.converge.succeeded.v1" {
		t.Fatalf("dev outcomes %v", got)
	}
	if v := recorded(t, r); v != "1.2.0" {
		t.Fatalf("dev installed version %q", v)
	}
}

// A start whose releases are signed already never opens the release key
// (its scrypt costs 64 MiB); one that must sign again does, and says so
// when it cannot.
func TestDevOpensTheReleaseKeyOnlyToSign(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := Dev(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	privPath := filepath.Join(dir, "keys", "cosign.key")
	if err := os.WriteFile(privPath, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Dev(context.Background(), dir); err != nil {
		t.Fatalf("a start with every release signed opened the key: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "registry", "1.2.0", BundleFile)); err != nil {
		t.Fatal(err)
	}
	_, _, err := Dev(context.Background(), dir)
	if err == nil || !strings.Contains(err.Error(), privPath) {
		t.Fatalf("a start that must sign 1.2.0 again with an unreadable key: %v", err)
	}
}

// After a crash the exec runner cannot reattach to its command: the
// checkpointed execution is reported as unknown and failed, never run again.
func TestExecRunnerUnknownExecutionAfterCrash(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	marker := filepath.Join(t.TempDir(), "ran")
	w, err := New(execConfig(t, t.TempDir(), key, "echo ran >> "+marker))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	res, err := w.run.watch(context.Background(), release{Version: "1.1.0"}, "exec-4242-lost")
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded || !strings.Contains(res.Condition, "whether it applied the release is unknown; it was not run a second time") {
		t.Fatalf("result %+v", res)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the command ran again: %v", err)
	}
}
