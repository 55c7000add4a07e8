package converge

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/workertest"
)

// testdata/cosign3 was made once with the real cosign v3.1.3 CLI, with a key
// `steward keys` wrote (password steward-test):
//
//	COSIGN_PASSWORD=steward-test steward keys --dir . --kind ecdsa-p256 --name cosign
//	COSIGN_PASSWORD=steward-test cosign sign-blob --key cosign.key --use-signing-config=false \
//	  --tlog-upload=false --bundle manifest.json.sigstore.json manifest.json
//	COSIGN_PASSWORD=steward-test cosign sign-blob --key cosign.key --use-signing-config=false \
//	  --tlog-upload=false --new-bundle-format=false --output-signature manifest.json.sig manifest.json
//	cosign verify-blob --key cosign.pub --bundle manifest.json.sigstore.json --insecure-ignore-tlog=true manifest.json
//
// So cosign itself took the key Steward writes, and what cosign 3 signs is
// what these tests verify.
const cosign3Dir = "testdata/cosign3"

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cosign3Dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cosign3Key is the public key the real cosign bundle was signed with.
func cosign3Key(t *testing.T) keyPair {
	t.Helper()
	return keyPair{pubPath: filepath.Join(cosign3Dir, "cosign.pub")}
}

// The key `steward keys` wrote for the testdata is in cosign's own
// encrypted format, opens with its password, and is the key of cosign.pub:
// the bundle beside it is cosign's proof that cosign accepted it.
func TestCosign3KeyIsStewardsFormat(t *testing.T) {
	raw := readTestdata(t, "cosign.key")
	if !bytes.HasPrefix(raw, []byte("-----BEGIN "+CosignKeyPEMType+"-----")) {
		t.Fatalf("cosign.key is not %s: %.50s", CosignKeyPEMType, raw)
	}
	s, err := LoadReleaseSigner(filepath.Join(cosign3Dir, "cosign.key"), []byte("steward-test"))
	if err != nil {
		t.Fatal(err)
	}
	pub := mustKey(t, cosign3Key(t))
	if !s.Public().(*ecdsa.PublicKey).Equal(pub) {
		t.Fatal("cosign.key is not the key of cosign.pub")
	}
	if _, err := LoadReleaseSigner(filepath.Join(cosign3Dir, "cosign.key"), []byte("wrong")); err == nil || !strings.Contains(err.Error(), "COSIGN_PASSWORD") {
		t.Fatalf("wrong password: %v", err)
	}
	// A key made now is the same format and signs bundles that verify.
	dir := t.TempDir()
	if err := GenerateCosignKeyPair(filepath.Join(dir, "k.key"), filepath.Join(dir, "k.pub"), []byte("pw")); err != nil {
		t.Fatal(err)
	}
	if err := GenerateCosignKeyPair(filepath.Join(dir, "k.key"), filepath.Join(dir, "k2.pub"), []byte("pw")); err == nil {
		t.Fatal("an existing key was replaced")
	}
	fresh, err := LoadReleaseSigner(filepath.Join(dir, "k.key"), []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	m := readTestdata(t, ManifestFile)
	b, err := SignBundle(fresh, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyBundle(newReleaseKeys(mustKey(t, keyPair{pubPath: filepath.Join(dir, "k.pub")})), "1.1.0", m, b); err != nil {
		t.Fatal(err)
	}
}

// The real cosign v3 bundle converges end to end, alone and beside the
// legacy signature cosign wrote for the same bytes; the legacy signature
// alone still converges too.
func TestRealCosign3BundleConverges(t *testing.T) {
	for _, files := range [][]string{{BundleFile}, {BundleFile, SignatureFile}, {SignatureFile}} {
		t.Run(strings.Join(files, "+"), func(t *testing.T) {
			reg := t.TempDir()
			dir := filepath.Join(reg, "1.1.0")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range append([]string{ManifestFile}, files...) {
				mustWrite(t, filepath.Join(dir, f), string(readTestdata(t, f)))
			}
			ran := filepath.Join(t.TempDir(), "ran")
			srv := workertest.StartServer(t)
			js := srv.JetStream(t)
			_, r := startWorker(t, js, execConfig(t, reg, cosign3Key(t), `echo "$STEWARD_IMAGE" > `+ran))
			publishRelease(t, js, "1.1.0", "")
			s := outcomeData[Succeeded](t, waitOutcomes(t, js, 1)[0], OutcomeSucceeded)
			if s.To != "1.1.0" || recorded(t, r) != "1.1.0" {
				t.Fatalf("succeeded %+v, recorded %q", s, recorded(t, r))
			}
			if got := ranLog(t, ran); got != image("1.1.0")+"\n" {
				t.Fatalf("ran %q", got)
			}
			var doc Installed
			if _, err := r.State().Get(context.Background(), InstalledDoc, &doc); err != nil || doc.Evidence == nil {
				t.Fatalf("recorded %+v without evidence (%v)", doc, err)
			}
			if (len(doc.Evidence.Bundle) > 0) != (files[0] == BundleFile) {
				t.Fatalf("recorded evidence has bundle %t, want %t", len(doc.Evidence.Bundle) > 0, files[0] == BundleFile)
			}
		})
	}
}

// patchBundle decodes a bundle, lets edit change it, and encodes it again.
func patchBundle(t *testing.T, raw []byte, edit func(map[string]any)) []byte {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	edit(b)
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func selfSignedCert(t *testing.T) []byte {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "someone"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// Every bundle that does not make these manifest bytes a release of the
// configured key is refused with the rule that failed: a tampered
// manifest, a bundle for other bytes, a digest patched to match over a
// signature of other bytes, another key, a certificate, no bundle at all,
// a DSSE envelope. A bad bundle is never passed over for a good legacy
// signature beside it.
func TestBundleRefusals(t *testing.T) {
	pub := mustKey(t, cosign3Key(t))
	manifestRaw := readTestdata(t, ManifestFile)
	real := readTestdata(t, BundleFile)
	legacy := readTestdata(t, SignatureFile)
	tampered := bytes.Replace(manifestRaw, []byte(image("1.1.0")), []byte(image("evil")), 1)
	other := newKeyPair(t, signing.P256)
	otherBundle, err := SignBundle(other.signer, manifestRaw)
	if err != nil {
		t.Fatal(err)
	}
	// What cosign would sign for a manifest naming the evil image.
	ownKey, err := LoadReleaseSigner(filepath.Join(cosign3Dir, "cosign.key"), []byte("steward-test"))
	if err != nil {
		t.Fatal(err)
	}
	forOther, err := SignBundle(ownKey, tampered)
	if err != nil {
		t.Fatal(err)
	}
	// GHSA-8gw7-4j42-w388: the digest claims the manifest, the signature
	// is over other bytes.
	digestOnly := patchBundle(t, forOther, func(b map[string]any) {
		d := b["messageSignature"].(map[string]any)["messageDigest"].(map[string]any)
		realDigest := patchBundleDigest(t, real)
		d["digest"] = realDigest
	})
	withCert := patchBundle(t, real, func(b map[string]any) {
		b["verificationMaterial"] = map[string]any{"certificate": map[string]any{"rawBytes": base64.StdEncoding.EncodeToString(selfSignedCert(t))}}
	})
	dsse := patchBundle(t, real, func(b map[string]any) {
		delete(b, "messageSignature")
		b["dsseEnvelope"] = map[string]any{"payload": base64.StdEncoding.EncodeToString(manifestRaw), "payloadType": "application/json", "signatures": []any{map[string]any{"sig": "AAAA"}}}
	})
	sha512 := patchBundle(t, real, func(b map[string]any) {
		b["messageSignature"].(map[string]any)["messageDigest"].(map[string]any)["algorithm"] = "SHA2_512"
	})
	for _, c := range []struct {
		name     string
		manifest []byte
		bundle   []byte
		sig      []byte
		rule     string
		want     string
	}{
		{"tampered manifest", tampered, real, nil, ruleBundleDigest, "signs a message digest that is not the SHA-256 of manifest.json"},
		{"bundle for other bytes", manifestRaw, forOther, nil, ruleBundleDigest, "is for other bytes"},
		{"digest patched, signature of other bytes", manifestRaw, digestOnly, nil, ruleSignature, "does not verify against the release key"},
		{"signed by another key", manifestRaw, otherBundle, nil, ruleSignature, "does not verify against the release key"},
		{"carries a certificate", manifestRaw, withCert, nil, ruleBundleCertificate, "carries a certificate"},
		{"not a bundle", manifestRaw, []byte(`{"hello":"world"}`), nil, ruleBundle, "is not a Sigstore bundle"},
		{"DSSE envelope", manifestRaw, dsse, nil, ruleBundle, "holds no message signature"},
		{"sha512 digest", manifestRaw, sha512, nil, ruleBundleDigest, "SHA2_256 only"},
		{"bad bundle beside a good signature", manifestRaw, otherBundle, legacy, ruleSignature, "with its manifest.json.sigstore.json"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := checkManifest(newReleaseKeys(pub), events.ReleasePublished{Version: "1.1.0"}, "1.0.0", Evidence{Manifest: c.manifest, Bundle: c.bundle, Signature: c.sig})
			var ref *refusal
			if !errors.As(err, &ref) || ref.rule != c.rule || !strings.Contains(ref.reason, c.want) || !strings.Contains(ref.reason, "nothing ran") {
				t.Fatalf("got %v, want a %s refusal saying %q and that nothing ran", err, c.rule, c.want)
			}
		})
	}
	if _, _, err := checkManifest(newReleaseKeys(pub), events.ReleasePublished{Version: "1.1.0"}, "1.0.0", Evidence{Manifest: manifestRaw, Bundle: real, Signature: legacy}); err != nil {
		t.Fatalf("the real cosign bundle: %v", err)
	}
}

// patchBundleDigest returns the base64 message digest of a bundle.
func patchBundleDigest(t *testing.T, raw []byte) string {
	t.Helper()
	var b struct {
		MessageSignature struct {
			MessageDigest struct {
				Digest string `json:"digest"`
			} `json:"messageDigest"`
		} `json:"messageSignature"`
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		t.Fatal(err)
	}
	return b.MessageSignature.MessageDigest.Digest
}
