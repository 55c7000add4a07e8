package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/tokens"
	"github.com/steward-dev/steward/publisher"
	"github.com/steward-dev/steward/workers/workertest"
)

// scopeRig is `steward serve --signing-key --tokens-dir` in process: the
// real ingress and console on one mux (real HTTP), on an embedded
// JetStream, with token documents issued by the real `steward token issue`
// and believed because the operator's document key is pinned.
type scopeRig struct {
	t         *testing.T
	js        jetstream.JetStream
	url       string
	legacy    string
	tokensDir string
	opKey     string
	opTrust   string
	keys      *signing.KeySet
}

const scopeLegacyToken = "legacy-ingress-token-0123456789"

func newScopeRig(t *testing.T) *scopeRig {
	t.Helper()
	srv := workertest.StartServer(t)
	r := &scopeRig{t: t, js: srv.JetStream(t), legacy: scopeLegacyToken}
	priv, keys := controllerPair(t)
	r.keys = keys
	dir := t.TempDir()
	ok(t, nil, "keys", "--dir", dir, "--kind", "ed25519", "--name", "operator")
	r.opKey, r.opTrust = filepath.Join(dir, "operator.key"), "operator="+filepath.Join(dir, "operator.pub")
	r.tokensDir = filepath.Join(dir, "tokens")
	if err := os.Mkdir(r.tokensDir, 0o700); err != nil {
		t.Fatal(err)
	}
	signer, err := loadSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	g := &globals{documentTrust: r.opTrust, log: zerolog.Nop()}
	gw, err := newGateway(g, r.js.Conn(), r.js, newRegistry(), ingressOptions{token: r.legacy, tokensDir: r.tokensDir, signer: signer}, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw)
	t.Cleanup(ts.Close)
	r.url = ts.URL
	return r
}

// issue runs `steward token issue` as the operator and returns the secret
// from the 0600 file it wrote.
func (r *scopeRig) issue(name string, args ...string) string {
	r.t.Helper()
	out := filepath.Join(r.t.TempDir(), name+".token")
	ok(r.t, nil, append([]string{"token", "issue", name, "--dir", r.tokensDir, "--out", out, "--document-key", r.opKey}, args...)...)
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 {
		r.t.Fatalf("the secret file %v (%v); want mode 0600", fi, err)
	}
	raw, _ := os.ReadFile(out)
	return strings.TrimSpace(string(raw))
}

// post sends one event in binary mode with token and returns the status
// and the ingress's answer.
func (r *scopeRig) post(token, typ, key, id, data string) (int, publisher.IngressResponse) {
	r.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.url+publisher.IngressPath, strings.NewReader(data))
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-type": typ, "ce-source": "/pipeline", "ce-id": id, "ce-subject": key, "content-type": "application/json"} {
		req.Header.Set(k, v)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out publisher.IngressResponse
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func grantData(machine string, gen uint64) string {
	b, _ := json.Marshal(events.GrantChanged{Machine: machine, Requirement: "postgres", Generation: gen, Given: []events.Given{}})
	return string(b)
}

// storedGeneration is the generation of the newest grant stored for
// machine, and whether it verifies with the controller key; 0 when none.
func (r *scopeRig) storedGeneration(machine string) (uint64, bool) {
	r.t.Helper()
	g, found := lastStored[events.GrantChanged](r.t, r.js, "steward.events.grant.changed."+machine)
	if !found {
		return 0, false
	}
	_, err := signing.OpenGrant(r.keys, g)
	return g.Generation, err == nil
}

// audits are the audit events stored for token name.
func (r *scopeRig) audits(name string) []tokens.Signed {
	r.t.Helper()
	s, err := r.js.Stream(context.Background(), events.StreamOutcomes)
	if err != nil {
		r.t.Fatal(err)
	}
	var out []tokens.Signed
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(events.OutcomeSubject(tokens.AuditWorker, name)))
	if err != nil {
		r.t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil || m.Subject != events.OutcomeSubject(tokens.AuditWorker, name) {
			continue
		}
		e, err := events.Decode(m.Header, m.Data)
		if err != nil || e.Type() != tokens.TypeSigned {
			r.t.Fatalf("audit message %d: %v %s", seq, err, m.Data)
		}
		var a tokens.Signed
		if err := json.Unmarshal(e.Data(), &a); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, a)
	}
	return out
}

// TestScopedTokensSignOnlyWithinTheirScope is the issue's second attack:
// anyone holding the ingress token (every pipeline, and the console's
// login) had any grant signed by the controller key, e.g. generation
// 9007199254740000, which pins the machine until an operator resets it.
// Now the unscoped token has nothing signed; a scoped token has signed
// only its types, its machines and generations within its window above
// the newest signed one stored, each signature is an audit event, and
// revoking the token ends it at the next request.
func TestScopedTokensSignOnlyWithinTheirScope(t *testing.T) {
	r := newScopeRig(t)
	const pin = 9007199254740000

	// The unscoped token: no signature at all, whatever it asks for.
	code, out := r.post(r.legacy, events.TypeGrantChanged, "db-1", "legacy-1", grantData("db-1", pin))
	if code != http.StatusForbidden || !strings.Contains(out.Error, "unscoped ingress token") || !strings.Contains(out.Error, "steward token issue") {
		t.Fatalf("the unscoped token asked for a grant: %d %q; want 403 naming the rule and the way out", code, out.Error)
	}
	if g, _ := r.storedGeneration("db-1"); g != 0 {
		t.Fatalf("the unscoped token's grant was stored: generation %d", g)
	}
	// It still publishes what the controller never signs.
	if code, out := r.post(r.legacy, events.TypeReleasePublished, "1.0.0", "rel-1", `{"version":"1.0.0"}`); code != http.StatusAccepted {
		t.Fatalf("a release with the unscoped token: %d %q", code, out.Error)
	}

	// A site's membership never goes through an ingress: stored unsigned
	// under the site's subject it would be believed nowhere, but it would
	// stand as the site's newest message.
	membership := `{"site":"site-a","envelope":{"payload":"e30=","payloadType":"application/vnd.steward.sitemembership.v1+json","signatures":[{"keyid":"k","sig":"c2ln"}]}}`
	if code, out := r.post(r.legacy, events.TypeSiteMembership, "site-a", "m-1", membership); code != http.StatusForbidden || !strings.Contains(out.Error, "never through an ingress") || !strings.Contains(out.Error, "steward publish --file") {
		t.Fatalf("a site membership through the ingress: %d %q; want 403 naming the operator's command", code, out.Error)
	}
	if _, found := lastStored[events.SiteMembership](t, r.js, events.MembershipSubject("site-a")); found {
		t.Fatal("the ingress stored a site membership")
	}
	if res := run(t, nil, "token", "issue", "sites", "--dir", r.tokensDir, "--out", filepath.Join(t.TempDir(), "sites.token"), "--document-key", r.opKey,
		"--types", "site.membership", "--keys", "site-a", "--window", "1"); res.code == 0 || !strings.Contains(res.stderr, "published by the operator alone") {
		t.Fatalf("a token for site memberships: exit %d %q; want refused", res.code, res.stderr)
	}

	secret := r.issue("ci-east", "--types", "grant.changed", "--keys", "db-1,db-2", "--window", "5")
	if strings.Contains(readAll(t, r.tokensDir), secret) {
		t.Fatal("the token's secret is in its document")
	}
	code, out = r.post(secret, events.TypeGrantChanged, "db-1", "g-1", grantData("db-1", 1))
	if code != http.StatusAccepted {
		t.Fatalf("generation 1 of db-1 with ci-east: %d %q", code, out.Error)
	}
	if g, signed := r.storedGeneration("db-1"); g != 1 || !signed {
		t.Fatalf("db-1's stored grant: generation %d, signed %v; want 1, signed", g, signed)
	}

	// Another machine: refused, and the refusal names what the token may.
	code, out = r.post(secret, events.TypeGrantChanged, "db-9", "g-9", grantData("db-9", 1))
	if code != http.StatusForbidden || !strings.Contains(out.Error, "token ci-east may publish grant.changed for machines db-1, db-2; db-9 is not one of them") {
		t.Fatalf("ci-east asked for db-9: %d %q", code, out.Error)
	}
	if g, _ := r.storedGeneration("db-9"); g != 0 {
		t.Fatalf("db-9's grant was stored: generation %d", g)
	}
	// The pin, and one past the window (base 1 + 5): refused.
	for _, gen := range []uint64{pin, 7} {
		code, out = r.post(secret, events.TypeGrantChanged, "db-1", "g-pin", grantData("db-1", gen))
		if code != http.StatusForbidden || !strings.Contains(out.Error, "from 2 to 6") || !strings.Contains(out.Error, "outside it") {
			t.Fatalf("ci-east asked for generation %d of db-1: %d %q", gen, code, out.Error)
		}
		if g, _ := r.storedGeneration("db-1"); g != 1 {
			t.Fatalf("after generation %d was asked for, db-1's stored grant is %d", gen, g)
		}
	}
	// Not above the newest signed one: refused too (nothing to gain, and
	// nothing a window allows).
	if code, out := r.post(secret, events.TypeGrantChanged, "db-1", "g-same", grantData("db-1", 1)); code != http.StatusForbidden {
		t.Fatalf("generation 1 again: %d %q", code, out.Error)
	}
	// A type the token does not name.
	recipient, err := agekey.Generate(filepath.Join(t.TempDir(), "hive.key"))
	if err != nil {
		t.Fatal(err)
	}
	ct, err := agekey.Encrypt(recipient, []byte("s"))
	if err != nil {
		t.Fatal(err)
	}
	rb, _ := json.Marshal(events.CredentialRotated{Hive: "db-1", Version: 1, ClientID: "c", Secret: ct})
	rot := string(rb)
	if code, out := r.post(secret, events.TypeCredentialRotated, "db-1", "r-1", rot); code != http.StatusForbidden || !strings.Contains(out.Error, "credential.rotated is not one of them") {
		t.Fatalf("ci-east asked for a rotation: %d %q", code, out.Error)
	}
	// The top of the window is signed, and the window moves with it.
	if code, out := r.post(secret, events.TypeGrantChanged, "db-1", "g-6", grantData("db-1", 6)); code != http.StatusAccepted {
		t.Fatalf("generation 6: %d %q", code, out.Error)
	}
	if g, signed := r.storedGeneration("db-1"); g != 6 || !signed {
		t.Fatalf("db-1 after generation 6: %d %v", g, signed)
	}

	// The issue's first attack at the ingress: a publisher stores an
	// unsigned grant at generation 50 straight on the bus. It is not a
	// base the window can be moved to: the ingress signs nothing for the
	// machine and says why.
	workertest.PublishData(t, r.js, events.TypeGrantChanged, "db-2", events.GrantChanged{Machine: "db-2", Requirement: "postgres", Generation: 50, Given: []events.Given{}})
	code, out = r.post(secret, events.TypeGrantChanged, "db-2", "g-51", grantData("db-2", 51))
	if code != http.StatusForbidden || !strings.Contains(out.Error, "is not signed by the controller") || !strings.Contains(out.Error, "source of truth") {
		t.Fatalf("ci-east asked for generation 51 over an unsigned 50: %d %q", code, out.Error)
	}
	if g, signed := r.storedGeneration("db-2"); g != 50 || signed {
		t.Fatalf("db-2 after the refusal: generation %d, signed %v; want the unsigned 50 alone", g, signed)
	}

	// Every signature made is an audit event on the token's subject, and
	// none holds the secret.
	a := r.audits("ci-east")
	if len(a) != 2 || a[0].Generation != 1 || a[0].EventID != "g-1" || a[1].Generation != 6 || a[1].Base != 1 || a[1].Via != "ingress" || a[0].Key != "db-1" {
		t.Fatalf("audit events %+v; want generations 1 and 6 of db-1", a)
	}
	if raw, _ := json.Marshal(a); bytes.Contains(raw, []byte(secret)) {
		t.Fatal("an audit event holds the token")
	}

	// The console's login takes the same token and signs through the same
	// gate: another machine is refused there too.
	c, csrf := consoleLogin(t, r.url, secret)
	code, msg := consolePublish(t, c, r.url, csrf, events.TypeGrantChanged, grantData("db-9", 1))
	if code != http.StatusForbidden || !strings.Contains(msg, "db-9 is not one of them") {
		t.Fatalf("the console published db-9 for ci-east: %d %q", code, msg)
	}
	if code, msg := consolePublish(t, c, r.url, csrf, events.TypeGrantChanged, grantData("db-1", 7)); code != http.StatusAccepted {
		t.Fatalf("the console, generation 7 of db-1: %d %q", code, msg)
	}
	if a := r.audits("ci-east"); len(a) != 3 || a[2].Via != "console" || a[2].Generation != 7 {
		t.Fatalf("audit events after the console's %+v", a)
	}

	// Revoked: the ingress refuses the token from its next request, and
	// the console session it opened has nothing more signed.
	r2 := ok(t, nil, "token", "revoke", "ci-east", "--dir", r.tokensDir)
	if !strings.Contains(r2.stdout, "revoked token ci-east") {
		t.Fatalf("revoke said %q", r2.stdout)
	}
	if code, out := r.post(secret, events.TypeGrantChanged, "db-1", "g-8", grantData("db-1", 8)); code != http.StatusUnauthorized {
		t.Fatalf("the revoked token: %d %q; want 401", code, out.Error)
	}
	code, msg = consolePublish(t, c, r.url, csrf, events.TypeGrantChanged, grantData("db-1", 8))
	if code != http.StatusForbidden || !strings.Contains(msg, "revoked") {
		t.Fatalf("the revoked token's console session: %d %q", code, msg)
	}
	if g, _ := r.storedGeneration("db-1"); g != 7 {
		t.Fatalf("db-1 after the revocation: generation %d, want 7", g)
	}
	if a := r.audits("ci-east"); len(a) != 3 {
		t.Fatalf("%d audit events after the revocation, want 3", len(a))
	}
}

// TestAForgedTokenDocumentIsRefused: a document in the folder that the
// operator did not sign (written by whoever can write there, or signed by
// another key) authenticates nobody.
func TestAForgedTokenDocumentIsRefused(t *testing.T) {
	r := newScopeRig(t)
	secret := tokens.NewSecret()
	other := t.TempDir()
	ok(t, nil, "keys", "--dir", other, "--kind", "ed25519", "--name", "operator")
	forged := t.TempDir()
	// Issued with another key into another folder, then copied in.
	ok(t, nil, "token", "issue", "evil", "--dir", forged, "--types", "grant.changed", "--keys", "*", "--window", "1000000000", "--document-key", filepath.Join(other, "operator.key"))
	raw, err := os.ReadFile(filepath.Join(forged, "evil.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Point it at a secret we know, as a forger would.
	var doc map[string]any
	_ = json.Unmarshal(raw, &doc)
	raw = bytes.Replace(raw, []byte(doc["tokenSHA256"].(string)), []byte(tokens.HashSecret(secret)), 1)
	if err := os.WriteFile(filepath.Join(r.tokensDir, "evil.json"), raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out := r.post(secret, events.TypeGrantChanged, "db-1", "g-1", grantData("db-1", 1)); code != http.StatusUnauthorized {
		t.Fatalf("a forged token document: %d %q; want 401", code, out.Error)
	}
	ls := ok(t, nil, "token", "ls", "--dir", r.tokensDir, "--document-trust", r.opTrust)
	if !strings.Contains(ls.stdout, "evil") || !strings.Contains(ls.stdout, "does not verify") {
		t.Fatalf("token ls: %q", ls.stdout)
	}
}

func readAll(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		raw, _ := os.ReadFile(filepath.Join(dir, f.Name()))
		b.Write(raw)
	}
	return b.String()
}

// consoleLogin logs in to the console with token and returns the client
// and its CSRF token.
func consoleLogin(t *testing.T, base, token string) (*http.Client, string) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(base+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	const marker = `name="csrf-token" content="`
	i := strings.Index(string(body), marker)
	if resp.StatusCode != http.StatusOK || i < 0 {
		t.Fatalf("console login: %s\n%s", resp.Status, body)
	}
	rest := string(body)[i+len(marker):]
	return c, rest[:strings.IndexByte(rest, '"')]
}

func consolePublish(t *testing.T, c *http.Client, base, csrf, typ, data string) (int, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"type": typ, "data": json.RawMessage(data)})
	req, _ := http.NewRequest(http.MethodPost, base+"/api/publish", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", csrf)
	req.Header.Set("Origin", base)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Error string `json:"error"`
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out.Error
}
