package converge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/converge/cloudrunfake"
	"github.com/steward-dev/steward/workers/workertest"
)

// Every release an install may not move to is refused with its own reason,
// as an outcome; the event is settled, never a dead letter, and nothing is
// recorded or run.
func TestRefusals(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	other := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	put := func(version string, m Manifest, k keyPair) string {
		writeRelease(t, reg, k, m)
		return filepath.Join(reg, version)
	}
	// 2.0.1: a signature file that is no signature.
	dir := put("2.0.1", manifest("2.0.1", "1.0.0"), key)
	mustWrite(t, filepath.Join(dir, SignatureFile), "bm90IGEgc2lnbmF0dXJl\n")
	// 2.0.2: signed by another key.
	put("2.0.2", manifest("2.0.2", "1.0.0"), other)
	// 2.0.3: changed after it was signed.
	dir = put("2.0.3", manifest("2.0.3", "1.0.0"), key)
	raw, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, ManifestFile), strings.Replace(string(raw), image("2.0.3"), image("evil"), 1))
	// 2.0.4: a correctly signed manifest for another version, placed at 2.0.4.
	m := manifest("2.0.5", "1.0.0")
	writeRelease(t, reg, key, m)
	if err := os.Rename(filepath.Join(reg, "2.0.5"), filepath.Join(reg, "2.0.4")); err != nil {
		t.Fatal(err)
	}
	// 2.0.6: fine, but the event names another digest.
	put("2.0.6", manifest("2.0.6", "1.0.0"), key)
	// 2.0.7: a tag, not a digest; 2.0.8: a tag and a digest.
	m = manifest("2.0.7", "1.0.0")
	m.OpsImage = "europe-docker.pkg.dev/steward-test/ops/shop-ops:2.0.7"
	put("2.0.7", m, key)
	m = manifest("2.0.8", "1.0.0")
	m.OpsImage = "europe-docker.pkg.dev/steward-test/ops/shop-ops:2.0.8@sha256:" + strings.Repeat("a", 64)
	put("2.0.8", m, key)
	// 0.9.0: a downgrade; 1.0.0: the installed version.
	put("0.9.0", manifest("0.9.0", "0.1.0"), key)
	put("1.0.0", manifest("1.0.0", "0.9.0"), key)
	// 2.1.0: needs 1.5.0 installed first.
	put("2.1.0", manifest("2.1.0", "1.5.0"), key)
	// 2.0.9: no signature at all.
	dir = put("2.0.9", manifest("2.0.9", "1.0.0"), key)
	if err := os.Remove(filepath.Join(dir, SignatureFile)); err != nil {
		t.Fatal(err)
	}
	// 2.0.10: a signed manifest with a field schema 1 does not have.
	mustSign(t, reg, key, "2.0.10", `{"schema":1,"version":"2.0.10","minFromVersion":"1.0.0","opsImage":"`+image("x")+`","publishedAt":"2026-03-01T12:00:00Z","env":{"A":"b"}}`)

	cases := []struct {
		name, version, digest, rule string
		reason                      []string
	}{
		{"bad signature", "2.0.1", "", ruleSignature, []string{"release 2.0.1 does not verify against the release key sha256:", "manifest.json.sig is not an ASN.1 ECDSA signature", "nothing ran"}},
		{"signed by another key", "2.0.2", "", ruleSignature, []string{"release 2.0.2 does not verify", "signed by another key"}},
		{"tampered after signing", "2.0.3", "", ruleSignature, []string{"release 2.0.3 does not verify", "changed after it was signed"}},
		{"version mismatch", "2.0.4", "", ruleVersionMismatch, []string{`event names release 2.0.4 but the signed manifest at 2.0.4/manifest.json is for version "2.0.5"`}},
		{"digest mismatch", "2.0.6", "sha256:" + strings.Repeat("0", 64), ruleDigest, []string{"event names manifest digest sha256:0000", "signed manifest in the registry is sha256:"}},
		{"unpinned image", "2.0.7", "", ruleUnpinned, []string{"opsImage \"europe-docker.pkg.dev/steward-test/ops/shop-ops:2.0.7\" is not pinned by digest", "no @sha256: digest"}},
		{"tag and digest", "2.0.8", "", ruleUnpinned, []string{"is not pinned by digest", "carries a tag"}},
		{"downgrade", "0.9.0", "", ruleDowngrade, []string{"release 0.9.0 is older than the installed 1.0.0", "downgrade is never applied"}},
		{"same version", "1.0.0", "", ruleSameVersion, []string{"release 1.0.0 is the installed version", "nothing to converge"}},
		{"below minFromVersion", "2.1.0", "", ruleMinFrom, []string{"release 2.1.0 needs at least 1.5.0 installed but 1.0.0 is"}},
		{"not in the registry", "3.0.0", "", ruleNotFound, []string{"release 3.0.0 has no manifest.json in registry"}},
		{"unsigned", "2.0.9", "", ruleNotFound, []string{"release 2.0.9 has neither manifest.json.sigstore.json nor manifest.json.sig", "an unsigned release is never applied"}},
		{"unknown manifest field", "2.0.10", "", ruleManifest, []string{"not a schema 1 manifest", `key "env" in $ is not a field of the document`}},
	}

	fake := cloudrunfake.Start(t)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, cloudRunConfig(reg, key, fake))
	ids := map[string]string{}
	for _, c := range cases {
		ids[c.version] = publishRelease(t, js, c.version, c.digest)
	}
	got := waitOutcomes(t, js, len(cases))
	noDeadLetters(t, js, r)
	reasons := map[string]string{}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ref := outcomeData[Refused](t, got[i], OutcomeRefused)
			if ref.Install != testInstall || ref.Version != c.version || ref.Rule != c.rule {
				t.Fatalf("refused %+v, want version %s rule %s", ref, c.version, c.rule)
			}
			for _, want := range c.reason {
				if !strings.Contains(ref.Reason, want) {
					t.Errorf("reason %q lacks %q", ref.Reason, want)
				}
			}
			if prev, dup := reasons[ref.Reason]; dup {
				t.Errorf("reason %q is the same as %s's", ref.Reason, prev)
			}
			reasons[ref.Reason] = c.name
			if cause, _ := got[i].Extensions()["causationid"].(string); cause != ids[c.version] {
				t.Errorf("refusal %d is caused by %q, not the event for %s (%s)", i, cause, c.version, ids[c.version])
			}
		})
	}
	if v := recorded(t, r); v != "" {
		t.Fatalf("refusals recorded installed version %q", v)
	}
	if n := fake.Calls("CreateJob") + fake.Calls("UpdateJob") + fake.Calls("RunJob") + fake.Calls("SetIamPolicy"); n != 0 {
		t.Fatalf("refusals reached Cloud Run with %d changing calls", n)
	}
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mustSign writes raw as a release's manifest with a valid signature.
func mustSign(t *testing.T, reg string, key keyPair, version, raw string) {
	t.Helper()
	dir := filepath.Join(reg, version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sig, err := signing.SignBlob(key.signer, []byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(dir, ManifestFile), raw)
	mustWrite(t, filepath.Join(dir, SignatureFile), sig)
}

var pathTricks = []string{
	"../1.0.0", "../../etc/passwd", "/etc/passwd", "/1.0.0", "1.0.0/../../secret",
	"https://evil.example/1.0.0", "file:///etc/passwd", "//evil.example/1.0.0",
	"..", ".", "", "1.0.0/", `1.0.0\..\x`, "%2e%2e/1.0.0", "1.0.0?x=1", "1.0.0#x",
	"1.0.0 ", "v1.0.0", "1.0", "1.0.0\x00", strings.Repeat("1", 200) + ".0.0",
}

// A version that could steer the registry somewhere else never becomes a
// path or a URL: the registry refuses it before building either, even
// though a file it could have reached is there.
func TestRegistryRefusesPathTricks(t *testing.T) {
	root := t.TempDir()
	reg := filepath.Join(root, "registry")
	if err := os.MkdirAll(reg, 0o755); err != nil {
		t.Fatal(err)
	}
	key := newKeyPair(t, signing.P256)
	// A signed release outside the registry, where "../outside" points.
	writeRelease(t, root, key, manifest("1.2.3", "1.0.0"))
	if err := os.Rename(filepath.Join(root, "1.2.3"), filepath.Join(root, "outside")); err != nil {
		t.Fatal(err)
	}
	dirReg := dirRegistry{root: reg}
	httpReg, err := newRegistry("https://registry.example/releases", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append(pathTricks, "../outside") {
		if _, _, err := dirReg.paths(v); err == nil {
			t.Errorf("dir registry built paths for %q", v)
		}
		if _, _, err := httpReg.(httpsRegistry).urls(v); err == nil {
			t.Errorf("https registry built URLs for %q", v)
		}
		for _, r := range []registry{dirReg, httpReg} {
			_, err := r.fetch(context.Background(), v)
			var ref *refusal
			if !errors.As(err, &ref) || ref.rule != ruleVersionFormat || !strings.Contains(ref.reason, "is not a semantic version") {
				t.Errorf("%s fetch(%q): %v, want a %s refusal", r, v, err, ruleVersionFormat)
			}
		}
	}
	m, s, err := dirReg.paths("1.2.3-rc.1+build.7")
	if err != nil || m != filepath.Join(reg, "1.2.3-rc.1+build.7", ManifestFile) || s != filepath.Join(reg, "1.2.3-rc.1+build.7", SignatureFile) {
		t.Fatalf("paths of a good version: %q %q %v", m, s, err)
	}
	mu, su, err := httpReg.(httpsRegistry).urls("1.2.3-rc.1+build.7")
	if err != nil || mu != "https://registry.example/releases/1.2.3-rc.1+build.7/manifest.json" || !strings.HasSuffix(su, "/manifest.json.sig") {
		t.Fatalf("urls of a good version: %q %q %v", mu, su, err)
	}
}

// The same tricks sent past the publisher, straight onto the subject, are
// refused by the runtime's validation before the handler: they land in the
// DLQ with the reason, and nothing is recorded or run.
func TestPathTrickEventsLandInDLQ(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	reg := t.TempDir()
	fake := cloudrunfake.Start(t)
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	w, r := startWorker(t, js, cloudRunConfig(reg, key, fake))
	tricks := []string{"../1.0.0", "/etc/passwd", "https://evil.example/9.9.9"}
	for _, v := range tricks {
		e := event.New()
		e.SetID("trick-" + hex.EncodeToString([]byte(v)))
		e.SetSource("/attacker")
		e.SetType(events.TypeReleasePublished)
		e.SetSubject(v)
		if err := e.SetData(events.ContentTypeJSON, map[string]string{"version": v}); err != nil {
			t.Fatal(err)
		}
		msg, err := events.Encode(w.Spec().Subjects[0], e)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
	}
	var dls []events.DeadLetter
	workertest.WaitUntil(t, "the tricks are in the DLQ", func() bool {
		dls = workertest.DeadLetters(t, js, Name, testInstall)
		return len(dls) == len(tricks)
	})
	for i, dl := range dls {
		if !strings.Contains(dl.Reason, "invalid event") || !strings.Contains(dl.Reason, "version") {
			t.Errorf("dead letter for %q: reason %q", tricks[i], dl.Reason)
		}
	}
	if got := workertest.Outcomes(t, js, Name, testInstall); len(got) != 0 {
		t.Fatalf("outcomes for events the handler never saw: %v", types(got))
	}
	if v := recorded(t, r); v != "" || fake.Calls("GetJob") != 0 {
		t.Fatalf("recorded %q, %d GetJob calls", v, fake.Calls("GetJob"))
	}
}

// checkManifest refuses what schema 1 does not allow, each with a reason.
func TestCheckManifestRules(t *testing.T) {
	key := newKeyPair(t, signing.P256)
	pub, err := signing.LoadPublicKey(key.pubPath)
	if err != nil {
		t.Fatal(err)
	}
	ok := `{"schema":1,"version":"1.1.0","minFromVersion":"1.0.0","opsImage":"` + image("1.1.0") + `","publishedAt":"2026-03-01T12:00:00Z"}`
	for _, c := range []struct {
		name, raw, rule, want string
	}{
		{"schema 2", strings.Replace(ok, `"schema":1`, `"schema":2`, 1), ruleManifest, "has schema 2"},
		{"not JSON", "schema: 1", ruleManifest, "not a schema 1 manifest"},
		{"two objects", ok + ok, ruleManifest, "data after the document"},
		{"bad minFromVersion", strings.Replace(ok, `"minFromVersion":"1.0.0"`, `"minFromVersion":"1.0"`, 1), ruleManifest, `minFromVersion "1.0"`},
		{"no minFromVersion", strings.Replace(ok, `"minFromVersion":"1.0.0",`, ``, 1), ruleManifest, `minFromVersion ""`},
		{"bad publishedAt", strings.Replace(ok, `2026-03-01T12:00:00Z`, `yesterday`, 1), ruleManifest, `publishedAt "yesterday"`},
		{"short digest", strings.Replace(ok, image("1.1.0"), "ghcr.io/x/ops@sha256:abcd", 1), ruleUnpinned, "not pinned by digest"},
		{"uppercase digest", strings.Replace(ok, image("1.1.0"), "ghcr.io/x/ops@sha256:"+strings.Repeat("A", 64), 1), ruleUnpinned, "not pinned by digest"},
		{"sha512", strings.Replace(ok, image("1.1.0"), "ghcr.io/x/ops@sha512:"+strings.Repeat("a", 128), 1), ruleUnpinned, "not sha256"},
		{"empty image", strings.Replace(ok, image("1.1.0"), "", 1), ruleUnpinned, "not pinned by digest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sig, err := signing.SignBlob(key.signer, []byte(c.raw))
			if err != nil {
				t.Fatal(err)
			}
			_, _, err = checkManifest(newReleaseKeys(pub), events.ReleasePublished{Version: "1.1.0"}, "1.0.0", Evidence{Manifest: []byte(c.raw), Signature: []byte(sig)})
			var ref *refusal
			if !errors.As(err, &ref) || ref.rule != c.rule || !strings.Contains(ref.reason, c.want) {
				t.Fatalf("got %v, want a %s refusal saying %q", err, c.rule, c.want)
			}
		})
	}
	sig, err := signing.SignBlob(key.signer, []byte(ok))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(ok))
	m, digest, err := checkManifest(newReleaseKeys(pub), events.ReleasePublished{Version: "1.1.0", ManifestDigest: "sha256:" + hex.EncodeToString(sum[:])}, "1.0.0", Evidence{Manifest: []byte(ok), Signature: []byte(sig)})
	if err != nil || m.OpsImage != image("1.1.0") || digest != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("a good manifest: %+v %s %v", m, digest, err)
	}
}
