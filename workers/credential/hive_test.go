package credential_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/workertest"
)

// hive is one credential worker under test, with its own identity and
// credential directory, running against a real embedded NATS server.
type hive struct {
	t         *testing.T
	js        jetstream.JetStream
	name      string
	recipient string
	cfg       credential.Config
	w         *credential.Worker
	logs      *workertest.Logs
	// attempts counts every delivery the handler received.
	attempts atomic.Int64
	// secrets are the plaintexts this test sent; none may leak.
	secrets [][]byte
	// handle, when set before start, handles deliveries instead of w (to
	// play a crash between the steps of a delivery).
	handle workers.HandlerFunc
}

// logLines returns the worker's log lines at a level ("error", "warn", ...).
func (h *hive) logLines(level string) []string {
	var out []string
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, `"level":"`+level+`"`) {
			out = append(out, l)
		}
	}
	return out
}

func newHive(t *testing.T, js jetstream.JetStream, name string) *hive {
	t.Helper()
	return newHiveWith(t, js, name, func(cfg *credential.Config) {
		if err := os.Mkdir(cfg.CredentialDir, 0o755); err != nil {
			t.Fatal(err)
		}
	})
}

// newHiveWith is newHive with the configuration (and the world) set up by
// prepare instead of a ready credential folder.
func newHiveWith(t *testing.T, js jetstream.JetStream, name string, prepare func(cfg *credential.Config)) *hive {
	t.Helper()
	base := t.TempDir()
	idPath := filepath.Join(base, "identity.txt")
	recipient, err := agekey.Generate(idPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := credential.Config{Hive: name, AgeIdentity: idPath, CredentialDir: filepath.Join(base, "files"), ControllerKey: controllerPub}
	prepare(&cfg)
	w, err := credential.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &hive{t: t, js: js, name: name, recipient: recipient, cfg: cfg, w: w, logs: &workertest.Logs{}}
}

// start runs the worker with fast retries, so retry tests wait on
// conditions rather than on the production backoff.
func (h *hive) start(spec workers.Spec) *workertest.Running {
	h.t.Helper()
	handler := workers.HandlerFunc(func(ctx context.Context, d *workers.Delivery) error {
		h.attempts.Add(1)
		if h.handle != nil {
			return h.handle(ctx, d)
		}
		return h.w.Handle(ctx, d)
	})
	return workertest.Start(h.t, h.js, spec, handler,
		workers.WithLogger(zerolog.New(h.logs)),
		workers.WithMaxBackoff(20*time.Millisecond),
		workers.WithMaxDeliver(10000),
		workers.WithAckWait(5*time.Second),
	)
}

// encrypt encrypts secret to the hive's recipient and remembers it as a
// value that must never leak.
func (h *hive) encrypt(secret string) string {
	h.t.Helper()
	h.secrets = append(h.secrets, []byte(secret))
	ct, err := agekey.Encrypt(h.recipient, []byte(secret))
	if err != nil {
		h.t.Fatal(err)
	}
	return ct
}

// publish publishes a rotation signed by the test controller, as the
// real controller publishes with `steward publish --signing-key`.
func (h *hive) publish(version uint64, clientID, ciphertext string) {
	h.t.Helper()
	workertest.PublishData(h.t, h.js, events.TypeCredentialRotated, h.name, signed(h.t, events.CredentialRotated{
		Hive: h.name, Version: version, ClientID: clientID, Secret: ciphertext,
	}))
}

// The test controller key pair, committed on purpose like hive-1.agekey:
// it signs the made-up rotations of these tests and nothing else.
const (
	controllerKey = "testdata/controller.key"
	controllerPub = "testdata/controller.pub"
)

// signed is data with the test controller's envelope.
func signed(t testing.TB, data events.CredentialRotated) events.CredentialRotated {
	t.Helper()
	return signedWith(t, controllerKey, data)
}

// signedWith is data with an envelope by the private key at keyPath.
func signedWith(t testing.TB, keyPath string, data events.CredentialRotated) events.CredentialRotated {
	t.Helper()
	key, err := signing.LoadPrivateKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	out, err := signing.SignRotation(key, data)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// publishRaw bypasses the publisher's validation, as a client that sets
// NATS headers itself can, so the runtime's own checks are exercised.
func publishRaw(t *testing.T, js jetstream.JetStream, subject, key string, data []byte) {
	t.Helper()
	e := event.New()
	e.SetID(fmt.Sprintf("raw-%d", time.Now().UnixNano()))
	e.SetType(events.TypeCredentialRotated)
	e.SetSource("/test/raw")
	e.SetSubject(key)
	e.SetTime(time.Now())
	if err := e.SetData(events.ContentTypeJSON, data); err != nil {
		t.Fatal(err)
	}
	msg, err := events.Encode(subject, e)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
}

// consumer is the worker's durable consumer.
func (h *hive) consumer() string { return credential.Name + "-" + h.name }

// logged says whether one log line holds every one of parts.
func (h *hive) logged(parts ...string) bool {
	for _, l := range strings.Split(h.logs.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

// waitOutcomes waits until n outcomes exist and returns them.
func (h *hive) waitOutcomes(n int) []event.Event {
	h.t.Helper()
	return waitExactly(h, n, "outcomes", func() []event.Event { return workertest.Outcomes(h.t, h.js, credential.Name, h.name) })
}

// waitDeadLetters waits until n dead letters exist and returns them.
func (h *hive) waitDeadLetters(n int) []events.DeadLetter {
	h.t.Helper()
	return waitExactly(h, n, "dead letters", func() []events.DeadLetter { return workertest.DeadLetters(h.t, h.js, credential.Name, h.name) })
}

// waitExactly waits until read finds n of what the hive's worker wrote,
// and fails if it finds more.
func waitExactly[T any](h *hive, n int, what string, read func() []T) []T {
	h.t.Helper()
	var got []T
	workertest.WaitUntil(h.t, fmt.Sprintf("%d %s of %s", n, what, h.name), func() bool {
		got = read()
		return len(got) >= n
	})
	if len(got) != n {
		h.t.Fatalf("want %d %s, got %d", n, what, len(got))
	}
	return got
}

// readPair reads the pair through the stable paths, as an agent does.
func readPair(dir string) (clientID, secret string, err error) {
	c, err := os.ReadFile(filepath.Join(dir, credential.ClientIDFile))
	if err != nil {
		return "", "", err
	}
	s, err := os.ReadFile(filepath.Join(dir, credential.SecretFile))
	if err != nil {
		return "", "", err
	}
	return string(c), string(s), nil
}

// checkPair fails unless the stable paths hold exactly this pair with the
// contract's modes.
func (h *hive) checkPair(clientID, secret string) {
	h.t.Helper()
	dir := h.cfg.CredentialDir
	c, s, err := readPair(dir)
	if err != nil {
		h.t.Fatal(err)
	}
	if c != clientID || s != secret {
		h.t.Fatalf("pair is (%q, <%d bytes>), want (%q, <%d bytes>)", c, len(s), clientID, len(secret))
	}
	for name, want := range map[string]fs.FileMode{credential.SecretFile: 0o600, credential.ClientIDFile: 0o644} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			h.t.Fatal(err)
		}
		if got := fi.Mode(); got != want {
			h.t.Errorf("%s has mode %v, want %v", name, got, want)
		}
		li, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			h.t.Fatal(err)
		}
		if li.Mode()&fs.ModeSymlink == 0 {
			h.t.Errorf("%s is not a link into %s", name, credential.DataLink)
		}
	}
}

// snapshot records a folder tree byte for byte: every entry's mode, every
// link's target and every file's content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		entry := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			entry += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			entry += " " + string(b)
		}
		out[rel] = entry
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	var diff []string
	for k, v := range before {
		if after[k] != v {
			diff = append(diff, fmt.Sprintf("%s changed", k))
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			diff = append(diff, fmt.Sprintf("%s appeared", k))
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Fatalf("%s: the credential files changed: %s", what, strings.Join(diff, ", "))
	}
}

// assertNoSecret scans everything a test can capture: log lines, outcomes
// (data and attributes), dead letters (headers and data) and the errors
// given.
func (h *hive) assertNoSecret(errs ...error) {
	h.t.Helper()
	var places []string
	places = append(places, "logs\x00"+h.logs.String())
	for _, o := range workertest.Outcomes(h.t, h.js, credential.Name, h.name) {
		raw, _ := json.Marshal(o)
		places = append(places, "outcome "+o.ID()+"\x00"+string(raw))
	}
	for _, dl := range workertest.DeadLetters(h.t, h.js, credential.Name, h.name) {
		raw, _ := json.Marshal(dl.Headers)
		places = append(places, fmt.Sprintf("dead letter %d\x00%s %s", dl.Sequence, raw, dl.Data))
	}
	for _, err := range errs {
		if err != nil {
			places = append(places, "error\x00"+err.Error())
		}
	}
	for _, secret := range h.secrets {
		if len(bytes.TrimSpace(secret)) == 0 {
			continue
		}
		for _, p := range places {
			where, text, _ := strings.Cut(p, "\x00")
			if strings.Contains(text, string(secret)) {
				h.t.Errorf("a secret appears in the %s", where)
			}
		}
	}
}

// The outcome types, as the runtime publishes them.
var (
	typeApplied = events.OutcomeType(credential.Name, credential.OutcomeApplied)
	typeSkipped = events.OutcomeType(credential.Name, credential.OutcomeSkipped)
	typeRefused = events.OutcomeType(credential.Name, credential.OutcomeRefused)
)

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
