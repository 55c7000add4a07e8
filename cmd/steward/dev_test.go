package main

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/converge"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/join"
	"github.com/steward-dev/steward/workers/workertest"
)

// devRun is a running `steward dev` and what it printed.
type devRun struct {
	p       *proc
	natsURL string
	ingress string
	token   string
}

func startDev(t *testing.T, dir string) devRun {
	t.Helper()
	p := start(t, nil, "dev", "--dir", dir, "--nats-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0")
	p.waitLine(t, "steward dev is running")
	lines := p.snapshot()
	d := devRun{p: p}
	// The NATS URL comes first, before anything that could fail later.
	first, ok := strings.CutPrefix(lines[0], "NATS with JetStream: ")
	if !ok || !strings.HasPrefix(first, "nats://127.0.0.1:") {
		t.Fatalf("first line %q does not give the NATS URL", lines[0])
	}
	d.natsURL = strings.Fields(first)[0]
	ing := p.waitLine(t, "ingress: POST ")
	f := strings.Fields(ing)
	d.ingress, d.token = f[2], strings.TrimSuffix(f[5], ",")
	return d
}

func connectJS(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// plainEvent is a release event as a program that is not Steward sends it:
// headers set by hand, core NATS publish.
func plainEvent(id, version, data string) *nats.Msg {
	m := nats.NewMsg("steward.events.release.published")
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-type", events.TypeReleasePublished)
	m.Header.Set("ce-source", "/not-steward")
	m.Header.Set("ce-id", id)
	m.Header.Set("ce-subject", version)
	m.Header.Set("content-type", "application/json")
	m.Data = []byte(data)
	return m
}

func outcomeOf(t *testing.T, js jetstream.JetStream, worker, instance, causation string) *struct{ typ, data string } {
	t.Helper()
	for _, o := range workertest.Outcomes(t, js, worker, instance) {
		if c, _ := o.Extensions()["causationid"].(string); c == causation {
			return &struct{ typ, data string }{o.Type(), string(o.Data())}
		}
	}
	return nil
}

// waitOutcome waits for the outcome a worker emitted for event id.
func waitOutcome(t *testing.T, js jetstream.JetStream, worker, instance, id string) (string, string) {
	t.Helper()
	var got *struct{ typ, data string }
	workertest.WaitUntil(t, worker+" emits an outcome for "+id, func() bool {
		got = outcomeOf(t, js, worker, instance, id)
		return got != nil
	})
	return got.typ, got.data
}

// TestDev runs `steward dev` as a newcomer would and proves: the NATS URL
// is printed first; an event published with plain NATS headers by a
// program that is not Steward is accepted, validated and handled (the
// outcome is read from STEWARD_OUTCOMES); malformed ones land in the DLQ
// with a reason naming the problem; the ingress, metrics and health answer;
// the publish lines the workers print work as printed; SIGINT stops it
// cleanly; and a second run reuses the store and the token.
func TestDev(t *testing.T) {
	dir := t.TempDir()
	d := startDev(t, dir)
	nc, js := connectJS(t, d.natsURL)

	raw, err := os.ReadFile(filepath.Join(dir, tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(raw)) != d.token || len(d.token) < 32 {
		t.Fatalf("token file holds %q, dev printed %q", raw, d.token)
	}
	if fi, _ := os.Stat(filepath.Join(dir, tokenFile)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", fi.Mode().Perm())
	}

	// 1. Plain headers, core NATS: accepted and handled.
	if err := nc.PublishMsg(plainEvent("plain-1.1.0", "1.1.0", `{"version":"1.1.0"}`)); err != nil {
		t.Fatal(err)
	}
	typ, data := waitOutcome(t, js, converge.Name, converge.DevInstall, "plain-1.1.0")
	if typ != "dev.steward.converge.succeeded.v1" || !strings.Contains(data, `"1.1.0"`) {
		t.Fatalf("outcome %s %s", typ, data)
	}

	// 2. Malformed: an unknown field, a bad version, and no CloudEvent at all.
	if err := nc.PublishMsg(plainEvent("bad-field", "1.2.0", `{"version":"1.2.0","image":"evil/ops:latest"}`)); err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishMsg(plainEvent("bad-version", "1.2", `{"version":"1.2"}`)); err != nil {
		t.Fatal(err)
	}
	notCE := nats.NewMsg("steward.events.release.published")
	notCE.Data = []byte(`{"version":"1.2.0"}`)
	if err := nc.PublishMsg(notCE); err != nil {
		t.Fatal(err)
	}
	var dls []workertest.DeadLetter
	workertest.WaitUntil(t, "three dead letters for converge-dev", func() bool {
		dls = workertest.DeadLetters(t, js, converge.Name, converge.DevInstall)
		return len(dls) == 3
	})
	// Invalid events skip the key lanes, so they reach the DLQ in any order.
	slices.SortFunc(dls, func(a, b workertest.DeadLetter) int { return cmp.Compare(a.Sequence, b.Sequence) })
	for i, want := range [][]string{{"image"}, {"/version", "1.2"}, {"not a CloudEvent", "ce-specversion"}} {
		for _, w := range want {
			if !strings.Contains(dls[i].Reason, w) {
				t.Fatalf("dead letter %d: reason %q does not name %q", i, dls[i].Reason, w)
			}
		}
		if dls[i].Delivered != 1 {
			t.Fatalf("dead letter %d after %d deliveries, want the first", i, dls[i].Delivered)
		}
	}

	// 3. The ingress, with the printed token, feeds the same workers.
	req, _ := http.NewRequest(http.MethodPost, d.ingress, strings.NewReader(`{"version":"1.2.0"}`))
	for k, v := range map[string]string{
		"Authorization": "Bearer " + d.token, "ce-specversion": "1.0", "ce-type": events.TypeReleasePublished,
		"ce-source": "/console", "ce-id": "http-1.2.0", "ce-subject": "1.2.0", "content-type": "application/json",
	} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("ingress: %d %s", resp.StatusCode, body)
	}
	if typ, data := waitOutcome(t, js, converge.Name, converge.DevInstall, "http-1.2.0"); typ != "dev.steward.converge.succeeded.v1" || !strings.Contains(data, `"1.2.0"`) {
		t.Fatalf("outcome %s %s", typ, data)
	}
	base := strings.TrimSuffix(d.ingress, publisher.IngressPath)
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "steward_events_total"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %.200s", path, resp.StatusCode, b)
		}
	}

	// 4. The publish lines the credential and join workers print work as
	// printed (with STEWARD_NATS_URL exported, as dev says).
	for _, worker := range []string{credential.Name, join.Name} {
		for _, line := range publishLines(t, d.p.snapshot(), worker) {
			sh := strings.Replace(line, "go run ./cmd/steward", bin, 1)
			cmd := exec.Command("sh", "-c", sh)
			cmd.Env = cleanEnv("STEWARD_NATS_URL=" + d.natsURL)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s line %q: %v\n%s", worker, line, err, out)
			}
		}
	}
	workertest.WaitUntil(t, "credential dev-hive applied", func() bool {
		for _, o := range workertest.Outcomes(t, js, credential.Name, credential.DevHive) {
			if o.Type() == "dev.steward.credential.applied.v1" {
				return true
			}
		}
		return false
	})
	secret, err := os.ReadFile(filepath.Join(dir, "credential", "files", credential.SecretFile))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(dir, "credential", "dev-secret.txt"))
	if string(secret) != string(want) || len(secret) == 0 {
		t.Fatalf("secret file %q, want the dev secret", secret)
	}
	workertest.WaitUntil(t, "join dev-box armed", func() bool {
		for _, o := range workertest.Outcomes(t, js, join.Name, join.DevBox) {
			if o.Type() == "dev.steward.join.armed.v1" {
				return true
			}
		}
		return false
	})

	// 5. join status reads the same box through the join flags' env twins.
	cfg, _, err := join.Dev(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	st := ok(t, []string{
		"STEWARD_BOX=" + cfg.Box, "STEWARD_DEPLOYMENT=" + cfg.Deployment,
		"STEWARD_CONSOLE_KEY=" + cfg.ConsoleKey, "STEWARD_RELEASE_KEY=" + cfg.ReleaseKey,
		"STEWARD_IDENTITY_RECORD=" + cfg.IdentityRecord, "STEWARD_INSTANCE_ID_FILE=" + cfg.InstanceIDFile,
		"STEWARD_OPT_DIR=" + cfg.OptDir, "STEWARD_ARM_COMMAND=" + cfg.ArmCommand, "STEWARD_ARMED_MARKER=" + cfg.ArmedMarker,
	}, "join", "status")
	if !strings.Contains(st.stdout, "box dev-box (deployment dev): armed") {
		t.Fatalf("join status:\n%s", st.stdout)
	}

	// 6. SIGINT stops it cleanly; a second run reuses store and token.
	if code := d.p.stop(t, syscall.SIGINT); code != 0 {
		t.Fatalf("dev exited %d after SIGINT", code)
	}
	nc.Close()
	d2 := startDev(t, dir)
	if d2.token != d.token {
		t.Fatalf("second run printed token %q, want the kept %q", d2.token, d.token)
	}
	_, js2 := connectJS(t, d2.natsURL)
	s, err := js2.Stream(context.Background(), publisher.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n < 5 {
		t.Fatalf("%d events kept across the restart, want at least 5", n)
	}
	if code := d2.p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("dev exited %d after SIGTERM", code)
	}
}

// publishLines returns the `steward publish` lines dev printed under a
// worker's "is running" line.
func publishLines(t *testing.T, lines []string, worker string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, worker+" is running"):
			in = true
		case !strings.HasPrefix(l, "  "):
			in = false
		case in && strings.Contains(l, "go run ./cmd/steward publish"):
			out = append(out, strings.TrimSpace(l[strings.Index(l, "go run ./cmd/steward"):]))
		}
	}
	if len(out) == 0 {
		t.Fatalf("dev printed no publish line for %s:\n%s", worker, strings.Join(lines, "\n"))
	}
	return out
}

// TestDevRefuses4222 proves dev never takes the port of a real NATS.
func TestDevRefuses4222(t *testing.T) {
	r := run(t, nil, "dev", "--dir", t.TempDir(), "--nats-listen", "127.0.0.1:4222")
	if r.code == 0 || !strings.Contains(r.stderr, "4222") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}
