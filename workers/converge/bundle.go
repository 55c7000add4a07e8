package converge

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/signature"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/steward-dev/steward/internal/signing"
)

// BundleFile is the Sigstore bundle cosign 3 writes beside a manifest
// (`cosign sign-blob --key … --bundle manifest.json.sigstore.json`). A
// registry may hold it, the legacy SignatureFile, or both; the bundle is
// preferred.
const BundleFile = "manifest.json.sigstore.json"

// The rules a bundle can be refused by, besides ruleSignature.
const (
	// ruleBundle: the file is no Sigstore bundle of a message signature.
	ruleBundle = "bundle-format"
	// ruleBundleDigest: the bundle's message digest is not the SHA-256 of
	// the manifest's bytes, so it signs something else.
	ruleBundleDigest = "bundle-digest"
	// ruleBundleCertificate: the bundle carries a certificate, but only a
	// key is configured, so nothing can vouch for that certificate.
	ruleBundleCertificate = "bundle-certificate"
)

// timeZero leaves a key's validity unbounded: a release key is valid until
// the operator configures another.
var timeZero time.Time

// verifyBundle checks a Sigstore bundle over manifest with the configured
// release key set, offline: no transparency log, no timestamp authority,
// no Fulcio.
// What a key-signed cosign bundle can say is checked rule by rule, and the
// first rule that fails is the refusal:
//   - it is a bundle (v0.1 to v0.3) holding a message signature, not a
//     DSSE envelope;
//   - it carries no certificate: with a key configured, a certificate is
//     someone else's identity that nothing here can check;
//   - its message digest is SHA-256 and equals the manifest's own digest,
//     compared here and not left to the library (GHSA-8gw7-4j42-w388: a
//     bundle whose digest names other bytes must not pass for these);
//   - its signature verifies against a key of the set, over the manifest's
//     bytes (sigstore-go, with that key as the only trusted material): each
//     key is tried in turn, and one that verifies is enough.
func verifyBundle(keys releaseKeys, version string, manifest, raw []byte) error {
	var b bundle.Bundle
	if err := b.UnmarshalJSON(raw); err != nil {
		return refuse(ruleBundle, "release %s's %s is not a Sigstore bundle (%v), so it is not trusted and nothing ran", version, BundleFile, err)
	}
	vm := b.GetVerificationMaterial()
	if vm.GetCertificate() != nil || vm.GetX509CertificateChain() != nil {
		return refuse(ruleBundleCertificate, "release %s's %s carries a certificate, but this worker is configured with release keys only (%s) and cannot vouch for a certificate, so it is not trusted and nothing ran; sign with `cosign sign-blob --key`", version, BundleFile, keys)
	}
	if vm.GetPublicKey() == nil {
		return refuse(ruleBundle, "release %s's %s names no public key, so it was not made with `cosign sign-blob --key` and nothing ran", version, BundleFile)
	}
	ms := b.GetMessageSignature()
	if ms == nil {
		return refuse(ruleBundle, "release %s's %s holds no message signature (a DSSE envelope or nothing), so it signs no manifest and nothing ran", version, BundleFile)
	}
	md := ms.GetMessageDigest()
	if md.GetAlgorithm() != protocommon.HashAlgorithm_SHA2_256 {
		return refuse(ruleBundleDigest, "release %s's %s has a %s message digest; this worker takes SHA2_256 only, so nothing ran", version, BundleFile, md.GetAlgorithm())
	}
	sum := sha256.Sum256(manifest)
	if subtle.ConstantTimeCompare(md.GetDigest(), sum[:]) != 1 {
		return refuse(ruleBundleDigest, "release %s's %s signs a message digest that is not the SHA-256 of %s (the bundle is for other bytes, or the manifest changed after signing), so it is not trusted and nothing ran", version, BundleFile, ManifestFile)
	}
	var failed []string
	for _, k := range keys {
		err := verifyBundleWith(k, &b, manifest)
		if err == nil {
			return nil
		}
		var bad *badBundleSignature
		if !errors.As(err, &bad) {
			return err
		}
		failed = append(failed, bad.Error())
	}
	return refuse(ruleSignature, "the manifest of release %s does not verify against %s with its %s (%s), so it is not trusted and nothing ran", version, keys, BundleFile, strings.Join(failed, "; "))
}

// badBundleSignature is a bundle's signature that one key does not verify.
type badBundleSignature struct {
	keyID string
	err   error
}

func (e *badBundleSignature) Error() string { return e.keyID + ": " + e.err.Error() }

// verifyBundleWith verifies the bundle's signature over manifest with one
// key: a *badBundleSignature when the key does not verify it, another error
// when the key cannot be used at all.
func verifyBundleWith(k releaseKey, b *bundle.Bundle, manifest []byte) error {
	verifier, err := signature.LoadVerifier(k.pub, crypto.SHA256)
	if err != nil {
		return fmt.Errorf("release key %s: %w", k.id, err)
	}
	trusted := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) {
		// The bundle's key hint is ignored: only the configured keys may
		// sign a release, and each is tried as the one trusted key.
		return root.NewExpiringKey(verifier, timeZero, timeZero), nil
	})
	v, err := verify.NewVerifier(trusted, verify.WithNoObserverTimestamps())
	if err != nil {
		return fmt.Errorf("bundle verifier: %w", err)
	}
	if _, err := v.Verify(b, verify.NewPolicy(verify.WithArtifact(bytes.NewReader(manifest)), verify.WithKey())); err != nil {
		return &badBundleSignature{keyID: k.id, err: err}
	}
	return nil
}

// BundleMediaType is the media type of the bundles cosign 3 writes.
const BundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json"

// SignBundle signs manifest with key and returns the Sigstore bundle
// `cosign sign-blob --key … --bundle … --tlog-upload=false` writes for it:
// a v0.3 bundle holding the key's hint (the base64 SHA-256 of its PKIX
// encoding, as cosign writes it), the manifest's SHA-256 and the
// signature. It is how `steward dev` and tests publish releases; a real
// pipeline runs cosign.
func SignBundle(key crypto.Signer, manifest []byte) ([]byte, error) {
	sigB64, err := signing.SignBlob(key, manifest)
	if err != nil {
		return nil, err
	}
	sig, err := base64.StdEncoding.DecodeString(sigB64)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return nil, err
	}
	hint := sha256.Sum256(der)
	sum := sha256.Sum256(manifest)
	b := &protobundle.Bundle{
		MediaType: BundleMediaType,
		VerificationMaterial: &protobundle.VerificationMaterial{
			Content: &protobundle.VerificationMaterial_PublicKey{PublicKey: &protocommon.PublicKeyIdentifier{Hint: base64.StdEncoding.EncodeToString(hint[:])}},
		},
		Content: &protobundle.Bundle_MessageSignature{MessageSignature: &protocommon.MessageSignature{
			MessageDigest: &protocommon.HashOutput{Algorithm: protocommon.HashAlgorithm_SHA2_256, Digest: sum[:]},
			Signature:     sig,
		}},
	}
	return protojson.Marshal(b)
}
