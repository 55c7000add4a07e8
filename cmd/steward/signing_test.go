package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/publisher"
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

// TestIngressSignsForAuthenticatedCallersOnly is the ingress's side of
// issue 12: without --signing-key it refuses credential.rotated and
// grant.changed with 403 naming the rule (storing nothing of the
// request); with one it validates, signs and stores them; a caller without
// the token gets the ingress's 401 either way, and other types pass as
// before.
func TestIngressSignsForAuthenticatedCallersOnly(t *testing.T) {
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	priv, keys := controllerPair(t)
	signer, err := loadSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	const token = "ingress-test-token"
	serve := func(s *signing.EventSigner) string {
		mux, err := ingressMux(&globals{}, js, newRegistry(), token, publisher.DefaultMaxBody, func() error { return nil }, s)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(mux)
		t.Cleanup(ts.Close)
		return ts.URL + publisher.IngressPath
	}
	post := func(url, tok, ctype string, body []byte, headers map[string]string) (int, publisher.IngressResponse) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		req.Header.Set("Content-Type", ctype)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out publisher.IngressResponse
		_ = json.Unmarshal(raw, &out)
		return resp.StatusCode, out
	}
	binary := func(typ, key, id string) map[string]string {
		return map[string]string{"ce-specversion": "1.0", "ce-type": typ, "ce-source": "/test", "ce-id": id, "ce-subject": key}
	}
	grant := []byte(`{"machine":"m1","requirement":"postgres","generation":9223372036854775807,"given":[]}`)

	unsignedURL := serve(nil)
	code, out := post(unsignedURL, token, "application/json", grant, binary(events.TypeGrantChanged, "m1", "g-1"))
	if code != http.StatusForbidden || !strings.Contains(out.Error, "must be signed by the controller") || !strings.Contains(out.Error, "--signing-key") {
		t.Fatalf("an unsigned grant without a signing key: %d %q", code, out.Error)
	}
	if _, found := lastStored[events.GrantChanged](t, js, "steward.events.grant.changed.m1"); found {
		t.Fatal("the refused grant was stored")
	}
	if code, _ := post(unsignedURL, "wrong", "application/json", grant, binary(events.TypeGrantChanged, "m1", "g-2")); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d, want the ingress's 401", code)
	}
	if code, out := post(unsignedURL, token, "application/json", []byte(`{"version":"1.0.0"}`), binary(events.TypeReleasePublished, "1.0.0", "rel-1")); code != http.StatusAccepted {
		t.Fatalf("a release through an ingress without a key: %d %q", code, out.Error)
	}

	signedURL := serve(signer)
	batch, _ := json.Marshal([]map[string]any{
		{"specversion": "1.0", "type": events.TypeReleasePublished, "source": "/test", "id": "rel-2", "subject": "1.0.1", "datacontenttype": "application/json", "data": map[string]string{"version": "1.0.1"}},
		{"specversion": "1.0", "type": events.TypeGrantChanged, "source": "/test", "id": "g-3", "subject": "m1", "datacontenttype": "application/json", "data": json.RawMessage(`{"machine":"m1","requirement":"postgres","generation":3,"given":[]}`)},
	})
	code, out = post(signedURL, token, "application/cloudevents-batch+json", batch, nil)
	if code != http.StatusAccepted || len(out.Events) != 2 || out.Events[1].ID != "g-3" {
		t.Fatalf("a batch through a signing ingress: %d %+v", code, out)
	}
	g, found := lastStored[events.GrantChanged](t, js, "steward.events.grant.changed.m1")
	if !found {
		t.Fatal("the signed grant was not stored")
	}
	if p, err := signing.OpenGrant(keys, g); err != nil || p.Generation != 3 {
		t.Fatalf("the stored grant does not verify: %+v %v", p, err)
	}
	// Validated before it is signed: nothing invalid is vouched for.
	code, out = post(signedURL, token, "application/json", []byte(`{"machine":"m1","requirement":"mysql","generation":4,"given":[]}`), binary(events.TypeGrantChanged, "m1", "g-4"))
	if code != http.StatusBadRequest || !strings.Contains(out.Error, "/requirement") {
		t.Fatalf("an invalid grant: %d %q", code, out.Error)
	}
	if g, _ := lastStored[events.GrantChanged](t, js, "steward.events.grant.changed.m1"); g.Generation != 3 {
		t.Fatalf("an invalid grant was stored: generation %d", g.Generation)
	}
}
