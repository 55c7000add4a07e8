package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/workers/workertest"
)

// writeContext saves a context as `nats context save` writes it, under
// its own XDG_CONFIG_HOME, and returns that folder.
func writeContext(t *testing.T, home, name string, fields map[string]any, selected bool) {
	t.Helper()
	dir := filepath.Join(home, "nats", "context")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The nats CLI writes every field, empty ones included.
	full := map[string]any{"description": "", "url": "", "socks_proxy": "", "token": "", "user": "", "password": "", "creds": "", "nkey": "",
		"cert": "", "key": "", "ca": "", "nsc": "", "jetstream_domain": "", "jetstream_api_prefix": "", "jetstream_event_prefix": "",
		"inbox_prefix": "", "user_jwt": "", "color_scheme": "", "tls_first": false, "windows_cert_store": "", "windows_cert_match_by": "", "windows_cert_match": "", "windows_ca_certs_match": nil}
	for k, v := range fields {
		full[k] = v
	}
	raw, err := json.MarshalIndent(full, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if selected {
		if err := os.WriteFile(filepath.Join(home, "nats", "context.txt"), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestContextsAreTheNatsCLIs: --context, NATS_CONTEXT and the selected
// context name the server as the nats CLI's context files do; a server
// given on the command line wins over a context nobody named; a context
// that does not exist is an error naming it.
func TestContextsAreTheNatsCLIs(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	if err := events.SetupBus(t.Context(), js, events.DefaultBusConfig(1)); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	writeContext(t, home, "lab", map[string]any{"url": srv.ClientURL(), "description": "the lab"}, false)
	env := []string{"XDG_CONFIG_HOME=" + home}
	firstLine := func(r result) string {
		first, _, _ := strings.Cut(r.stdout, "\n")
		return first
	}

	r := run(t, env, "--context", "lab", "status")
	if r.code != 0 || !strings.HasPrefix(firstLine(r), "NATS "+srv.ClientURL()) {
		t.Fatalf("--context lab: exit %d, first line %q, stderr %s", r.code, firstLine(r), r.stderr)
	}
	r = run(t, append(env, "NATS_CONTEXT=lab"), "status")
	if r.code != 0 || !strings.HasPrefix(firstLine(r), "NATS "+srv.ClientURL()) {
		t.Fatalf("NATS_CONTEXT=lab: exit %d, first line %q, stderr %s", r.code, firstLine(r), r.stderr)
	}

	// Selected in context.txt, it is read when nothing names a server.
	writeContext(t, home, "lab", map[string]any{"url": srv.ClientURL()}, true)
	r = run(t, env, "status")
	if r.code != 0 || !strings.HasPrefix(firstLine(r), "NATS "+srv.ClientURL()) {
		t.Fatalf("the selected context: exit %d, first line %q, stderr %s", r.code, firstLine(r), r.stderr)
	}
	// A server on the command line wins over the selected context.
	r = run(t, env, "--nats-url", "nats://127.0.0.1:1", "status")
	if r.code == 0 || !strings.Contains(r.stderr, "127.0.0.1:1") {
		t.Fatalf("--nats-url beside a selected context: exit %d, stderr %s; want the named server tried", r.code, r.stderr)
	}
	r = run(t, env, "--context", "nowhere", "status")
	if r.code == 0 || !strings.Contains(r.stderr, "nats context nowhere") {
		t.Fatalf("a missing context: exit %d, stderr %s", r.code, r.stderr)
	}
}

// TestDevContextsKeepOthers: dev writes its contexts, and never one of the
// same name that it did not write.
func TestDevContextsKeepOthers(t *testing.T) {
	home := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", home)
	writeContext(t, home, "steward-dev-publisher", map[string]any{"url": "nats://mine:4222", "description": "mine"}, false)
	creds := filepath.Join(t.TempDir(), "operator.creds")
	if wrote, err := writeDevContext("steward-dev-operator", "nats://127.0.0.1:4223", creds, ".steward"); err != nil || !wrote {
		t.Fatalf("dev's own context: wrote %v, %v", wrote, err)
	}
	if wrote, err := writeDevContext("steward-dev-operator", "nats://127.0.0.1:4224", creds, ".steward"); err != nil || !wrote {
		t.Fatalf("dev's own context again: wrote %v, %v", wrote, err)
	}
	if wrote, err := writeDevContext("steward-dev-publisher", "nats://127.0.0.1:4223", creds, ".steward"); err != nil || wrote {
		t.Fatalf("someone else's context: wrote %v, %v; want it kept", wrote, err)
	}
	c, _, err := loadContext("steward-dev-operator")
	if err != nil || c.URL != "nats://127.0.0.1:4224" || c.Creds != creds {
		t.Fatalf("dev's context reads back as %+v (%v)", c, err)
	}
	if c, _, err := loadContext("steward-dev-publisher"); err != nil || c.URL != "nats://mine:4222" {
		t.Fatalf("the other context was changed: %+v (%v)", c, err)
	}
}

// TestNoServerConfiguredSaysSo: an operator's command with no server, no
// context and no selected context says so instead of trying whatever
// listens on 127.0.0.1:4222.
func TestNoServerConfiguredSaysSo(t *testing.T) {
	r := run(t, []string{"XDG_CONFIG_HOME=" + t.TempDir()}, "status")
	if r.code == 0 || !strings.Contains(r.stderr, "no NATS server is configured") || !strings.Contains(r.stderr, "--context") {
		t.Fatalf("status with nothing configured: exit %d, stderr %s", r.code, r.stderr)
	}
}
