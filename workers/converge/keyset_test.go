package converge

import (
	"crypto"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// keySetFile writes the public keys of pairs into one PEM file, one PUBLIC
// KEY block after another, as an operator concatenates two .pub files.
func keySetFile(t *testing.T, pairs ...keyPair) string {
	t.Helper()
	var set []byte
	for _, p := range pairs {
		raw, err := os.ReadFile(p.pubPath)
		if err != nil {
			t.Fatal(err)
		}
		set = append(set, raw...)
	}
	path := filepath.Join(t.TempDir(), "release-keys.pub")
	if err := os.WriteFile(path, set, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkedKeys loads --release-key spec as the worker does (Config.check)
// and returns the set it verifies with.
func checkedKeys(t *testing.T, spec string) releaseKeys {
	t.Helper()
	cfg := execConfig(t, t.TempDir(), keyPair{pubPath: spec}, "true")
	c, err := cfg.check()
	if err != nil {
		t.Fatal(err)
	}
	return c.keys
}

// signedEvidence is manifest m signed by key, as a Sigstore bundle or as a
// legacy manifest.json.sig.
func signedEvidence(t *testing.T, key crypto.Signer, m Manifest, bundle bool) Evidence {
	t.Helper()
	reg := t.TempDir()
	var err error
	if bundle {
		err = WriteBundleRelease(reg, key, m)
	} else {
		err = WriteRelease(reg, key, m)
	}
	if err != nil {
		t.Fatal(err)
	}
	ev, err := (dirRegistry{root: reg}).fetch(t.Context(), m.Version)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func assertSignatureRefusal(t *testing.T, err error, wants ...string) {
	t.Helper()
	var ref *refusal
	if !errors.As(err, &ref) || ref.rule != ruleSignature {
		t.Fatalf("got %v, want a %s refusal", err, ruleSignature)
	}
	for _, want := range wants {
		if !strings.Contains(ref.reason, want) {
			t.Errorf("refusal %q does not say %q", ref.reason, want)
		}
	}
}

// TestReleaseKeySetAcceptsEitherKey: --release-key holding two keys (one
// PEM file of two blocks, or two files separated by commas; ECDSA P-256
// and ed25519 together) accepts a manifest signed by either, as a Sigstore
// bundle and as a legacy .sig, and refuses one signed by a third key with
// the signature rule, naming both keys of the set.
func TestReleaseKeySetAcceptsEitherKey(t *testing.T) {
	a, b, stranger := newKeyPair(t, signing.P256), newKeyPair(t, signing.Ed25519), newKeyPair(t, signing.P256)
	for name, spec := range map[string]string{
		"one file of two blocks": keySetFile(t, a, b),
		"two files":              a.pubPath + "," + b.pubPath,
	} {
		t.Run(name, func(t *testing.T) {
			keys := checkedKeys(t, spec)
			if len(keys) != 2 {
				t.Fatalf("--release-key %s loaded %d keys, want 2", spec, len(keys))
			}
			for _, bundle := range []bool{true, false} {
				for signer, key := range map[string]keyPair{"first": a, "second": b} {
					ev := signedEvidence(t, key.signer, manifest("1.1.0", "1.0.0"), bundle)
					if _, _, err := checkManifest(keys, events.ReleasePublished{Version: "1.1.0"}, "1.0.0", ev); err != nil {
						t.Errorf("bundle %v, signed by the %s key of the set: %v", bundle, signer, err)
					}
				}
				ev := signedEvidence(t, stranger.signer, manifest("1.1.0", "1.0.0"), bundle)
				_, _, err := checkManifest(keys, events.ReleasePublished{Version: "1.1.0"}, "1.0.0", ev)
				assertSignatureRefusal(t, err, "any of the 2 release keys", keys[0].id, keys[1].id, "nothing ran")
			}
		})
	}

	// The bundle the real cosign 3 wrote verifies with its key second in
	// a set: every key of the set is tried, not only the first.
	keys := checkedKeys(t, keySetFile(t, a, cosign3Key(t)))
	ev := Evidence{Manifest: readTestdata(t, ManifestFile), Bundle: readTestdata(t, BundleFile)}
	if _, _, err := verifyEvidence(keys, "1.1.0", ev); err != nil {
		t.Fatalf("the real cosign bundle with its key second in the set: %v", err)
	}
	// A bundle that fails before any key is tried (other bytes) is refused
	// by its own rule, not as a signature by no key of the set.
	ev.Manifest = append(append([]byte(nil), ev.Manifest...), ' ')
	var ref *refusal
	if _, _, err := verifyEvidence(keys, "1.1.0", ev); !errors.As(err, &ref) || ref.rule != ruleBundleDigest {
		t.Fatalf("a bundle for other bytes: %v, want a %s refusal", err, ruleBundleDigest)
	}
}

// TestReleaseKeySetWorker runs the worker with two release keys in
// --release-key: a release signed by the first key (a bundle) and one by
// the second (a legacy .sig) converge; one signed by a third key is refused
// with the signature rule and converges nothing.
func TestReleaseKeySetWorker(t *testing.T) {
	a, b, stranger := newKeyPair(t, signing.P256), newKeyPair(t, signing.P256), newKeyPair(t, signing.P256)
	reg := t.TempDir()
	if err := WriteBundleRelease(reg, a.signer, manifest("1.1.0", "1.0.0")); err != nil {
		t.Fatal(err)
	}
	writeRelease(t, reg, b, manifest("1.2.0", "1.1.0"))
	writeRelease(t, reg, stranger, manifest("1.3.0", "1.2.0"))
	cfg := execConfig(t, reg, keyPair{pubPath: keySetFile(t, a, b)}, "true")
	srv := workertest.StartServer(t)
	js := srv.JetStream(t)
	_, r := startWorker(t, js, cfg)
	for _, v := range []string{"1.1.0", "1.2.0", "1.3.0"} {
		publishRelease(t, js, v, "")
	}
	got := waitOutcomes(t, js, 3)
	noDeadLetters(t, js, r)
	for i, want := range []string{"1.1.0", "1.2.0"} {
		if s := outcomeData[Succeeded](t, got[i], OutcomeSucceeded); s.To != want {
			t.Fatalf("outcome %d: succeeded %+v, want to %s", i, s, want)
		}
	}
	ref := outcomeData[Refused](t, got[2], OutcomeRefused)
	if ref.Rule != ruleSignature || ref.Version != "1.3.0" || !strings.Contains(ref.Reason, "any of the 2 release keys") {
		t.Fatalf("the release signed by a third key: %+v, want rule %s naming the set", ref, ruleSignature)
	}
	if v := recorded(t, r); v != "1.2.0" {
		t.Fatalf("installed version %q, want 1.2.0", v)
	}
}

// TestReleaseKeyRotation is the rotation story at the verifier: with the
// old key only, the new key's releases are refused; with both, releases
// of either verify; with the new key only, the old key's are refused and
// the new key's verify.
func TestReleaseKeyRotation(t *testing.T) {
	oldKey, newKey := newKeyPair(t, signing.P256), newKeyPair(t, signing.P256)
	byOld := signedEvidence(t, oldKey.signer, manifest("1.1.0", "1.0.0"), true)
	byNew := signedEvidence(t, newKey.signer, manifest("1.1.0", "1.0.0"), true)
	for _, step := range []struct {
		name         string
		spec         string
		oldOK, newOK bool
	}{
		{"old key only", oldKey.pubPath, true, false},
		{"both keys", oldKey.pubPath + "," + newKey.pubPath, true, true},
		{"new key only", newKey.pubPath, false, true},
	} {
		keys := checkedKeys(t, step.spec)
		for signer, c := range map[string]struct {
			ev Evidence
			ok bool
		}{"old": {byOld, step.oldOK}, "new": {byNew, step.newOK}} {
			_, _, err := verifyEvidence(keys, "1.1.0", c.ev)
			if c.ok && err != nil {
				t.Errorf("%s: the release signed by the %s key: %v, want it verified", step.name, signer, err)
			}
			if !c.ok {
				var ref *refusal
				if !errors.As(err, &ref) || ref.rule != ruleSignature {
					t.Errorf("%s: the release signed by the %s key: %v, want a %s refusal", step.name, signer, err, ruleSignature)
				}
			}
		}
	}
}
