package converge

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/rs/zerolog"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/internal/strictjson"
)

// The rules a release can be refused by, as the "rule" of a refused
// outcome.
const (
	ruleVersionFormat    = "version-format"
	ruleNotFound         = "not-found"
	ruleSignature        = "signature"
	ruleManifest         = "manifest"
	ruleVersionMismatch  = "version-mismatch"
	ruleDigest           = "digest-mismatch"
	ruleUnpinned         = "unpinned-image"
	ruleDowngrade        = "downgrade"
	ruleSameVersion      = "same-version"
	ruleMinFrom          = "min-from-version"
	ruleInstalledUnknown = "installed-version-unknown"
	// ruleInstalledUnverified: the installed-version document is missing
	// once the install has state, or names a version no signed evidence
	// backs.
	ruleInstalledUnverified = "installed-version-unverified"
	// ruleCheckpoint: a checkpointed stage that no verified manifest
	// backs (another image, version or starting point than it signs).
	ruleCheckpoint = "checkpoint-unverified"
)

// refusal is a release the worker will not converge to, whatever a retry
// does: it becomes a refused outcome, and the event is settled.
type refusal struct {
	rule   string
	reason string
}

func (r *refusal) Error() string { return r.reason }

func refuse(rule, format string, args ...any) *refusal {
	return &refusal{rule: rule, reason: fmt.Sprintf(format, args...)}
}

// ManifestSchema is the only manifest schema this worker reads.
const ManifestSchema = 1

// Manifest is a release manifest, <registry>/<version>/manifest.json. Its
// signature is the Sigstore bundle manifest.json.sigstore.json that cosign 3
// writes (`cosign sign-blob --key … --bundle …`) or the legacy base64
// manifest.json.sig cosign 2 wrote, over the file's exact bytes.
type Manifest struct {
	Schema         int    `json:"schema"`
	Version        string `json:"version"`
	MinFromVersion string `json:"minFromVersion"`
	// OpsImage is the ops job's image, pinned: <repo>@sha256:<64 hex>.
	OpsImage    string `json:"opsImage"`
	PublishedAt string `json:"publishedAt"`
}

// release is a verified release this install may move to.
type release struct {
	Install string
	// EventID is the release.published event being converged: every
	// execution is labelled with it, and found by it.
	EventID        string
	Version        string
	From           string
	Image          string
	ManifestDigest string
	logger         zerolog.Logger
}

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Evidence is the signed material a decision rests on: the manifest's exact
// bytes and the signature that makes them a release. It is kept in every
// checkpointed stage and in the installed-version document because stored
// state is a cache, never proof: whoever can write the checkpoint bucket can
// write any version or image there, but cannot sign a manifest, so whatever
// is read back is verified again from these bytes before it is acted on.
type Evidence struct {
	// Manifest is manifest.json byte for byte, as it was signed.
	Manifest []byte `json:"manifest"`
	// Signature is manifest.json.sig as the registry held it (legacy
	// base64 signature), if any.
	Signature []byte `json:"signature,omitempty"`
	// Bundle is manifest.json.sigstore.json as the registry held it (the
	// Sigstore bundle cosign 3 writes), if any.
	Bundle []byte `json:"bundle,omitempty"`
}

// verifyEvidence checks that ev is a signed release manifest for version:
// the signature verifies against a key of the release key set, the
// document is a schema 1 manifest for that very version with a pinned
// image. It returns the manifest and the digest of its bytes. It decides
// nothing about the install; checkRelease does. Every "no" is a *refusal.
func verifyEvidence(keys releaseKeys, version string, ev Evidence) (Manifest, string, error) {
	var m Manifest
	if err := verifySignature(keys, version, ev); err != nil {
		return m, "", err
	}
	raw := ev.Manifest
	sum := sha256.Sum256(raw)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if err := decodeManifest(raw, &m); err != nil {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s is not a schema %d manifest: %v, so it is not read and nothing ran", version, ManifestSchema, err)
	}
	if m.Schema != ManifestSchema {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has schema %d; this worker reads schema %d only, so nothing ran", version, m.Schema, ManifestSchema)
	}
	if m.Version != version {
		return m, "", refuse(ruleVersionMismatch, "the event names release %s but the signed manifest at %s/%s is for version %q; a manifest is only good for its own version, so nothing ran", version, version, ManifestFile, m.Version)
	}
	if err := checkPinned(m.OpsImage); err != nil {
		return m, "", refuse(ruleUnpinned, "release %s's opsImage %q is not pinned by digest (%v); only <repo>@sha256:<64 hex> runs, so nothing ran", version, m.OpsImage, err)
	}
	if _, err := time.Parse(time.RFC3339, m.PublishedAt); err != nil {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has publishedAt %q, not an RFC 3339 time, so nothing ran", version, m.PublishedAt)
	}
	if _, err := events.ParseVersion(m.MinFromVersion); err != nil {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has minFromVersion %q: %v, so nothing ran", version, m.MinFromVersion, err)
	}
	if _, err := events.ParseVersion(m.Version); err != nil {
		return m, "", refuse(ruleVersionFormat, "release %s: %v, so nothing ran", version, err)
	}
	return m, digest, nil
}

// verifySignature checks the evidence's signature over its manifest bytes:
// the Sigstore bundle when there is one (a bad bundle is refused, never
// passed over for the legacy signature beside it), else the legacy base64
// signature. Either is good when one key of the release key set verifies
// it.
func verifySignature(keys releaseKeys, version string, ev Evidence) error {
	if len(keys) == 0 {
		return errors.New("no release key is configured, so no release can be verified: give --release-key (STEWARD_RELEASE_KEY)")
	}
	if len(ev.Bundle) > 0 {
		return verifyBundle(keys, version, ev.Manifest, ev.Bundle)
	}
	if len(ev.Signature) == 0 {
		return refuse(ruleNotFound, "release %s has neither %s nor %s%s", version, BundleFile, SignatureFile, missingNote(SignatureFile))
	}
	for _, k := range keys {
		if signing.VerifyBlob(k.pub, ev.Manifest, string(ev.Signature)) == nil {
			return nil
		}
	}
	return refuse(ruleSignature, "the manifest of release %s does not verify against %s (%s), so it is not trusted and nothing ran", version, keys, signatureProblem(keys, ev.Signature))
}

// decodeManifest decodes a signed manifest exactly as a reviewer reads it
// (issue 12, finding 10): encoding/json alone matches keys to fields without
// regard to case and lets the last of two equal keys win, so a manifest
// showing "opsImage" could run the image under "OpsImage". strictjson
// refuses duplicate keys, keys that are not a field's exact name, unknown
// keys and trailing data.
func decodeManifest(raw []byte, m *Manifest) error {
	return strictjson.Decode(raw, m)
}

// checkManifest verifies a release's evidence and decides whether an
// install at installed may move to it: verifyEvidence, then checkRelease.
func checkManifest(keys releaseKeys, ev events.ReleasePublished, installed string, evd Evidence) (Manifest, string, error) {
	m, digest, err := verifyEvidence(keys, ev.Version, evd)
	if err != nil {
		return m, "", err
	}
	if err := checkRelease(m, digest, ev, installed); err != nil {
		return m, "", err
	}
	return m, digest, nil
}

// checkRelease decides whether an install at installed may move to the
// verified manifest m (whose bytes have digest) that the event ev names.
func checkRelease(m Manifest, digest string, ev events.ReleasePublished, installed string) error {
	if ev.ManifestDigest != "" && ev.ManifestDigest != digest {
		return refuse(ruleDigest, "the event names manifest digest %s but release %s's signed manifest in the registry is %s; the event and the registry disagree, so nothing ran", ev.ManifestDigest, ev.Version, digest)
	}
	target, err := events.ParseVersion(m.Version)
	if err != nil {
		return refuse(ruleVersionFormat, "release %s: %v, so nothing ran", ev.Version, err)
	}
	minFrom, err := events.ParseVersion(m.MinFromVersion)
	if err != nil {
		return refuse(ruleManifest, "the signed manifest of release %s has minFromVersion %q: %v, so nothing ran", ev.Version, m.MinFromVersion, err)
	}
	cur, err := events.ParseVersion(installed)
	if err != nil {
		return refuse(ruleInstalledUnverified, "the installed version %q is not a semantic version, so no release can be checked against it and nothing ran", installed)
	}
	switch c := target.Compare(cur); {
	case c < 0:
		return refuse(ruleDowngrade, "release %s is older than the installed %s; a downgrade is never applied, so %s stays installed", ev.Version, installed, installed)
	case c == 0:
		return refuse(ruleSameVersion, "release %s is the installed version (%s); there is nothing to converge", ev.Version, installed)
	}
	if minFrom.Compare(cur) > 0 {
		return refuse(ruleMinFrom, "release %s needs at least %s installed but %s is; install the releases in between first, %s stays installed", ev.Version, m.MinFromVersion, installed, installed)
	}
	return nil
}

// signatureProblem says why a signature did not verify, as far as can be
// told: a file that is no signature at all, or a signature that belongs to
// other bytes or another key (which no one can tell apart). A signature
// only reads as malformed when it has the form of no key of the set.
func signatureProblem(keys releaseKeys, sig []byte) string {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sig)))
	if err != nil {
		return SignatureFile + " is not base64"
	}
	var malformed []string
	seen := map[string]bool{}
	for _, k := range keys {
		problem := ""
		switch k.pub.(type) {
		case *ecdsa.PublicKey:
			var rs struct{ R, S *big.Int }
			if rest, err := asn1.Unmarshal(raw, &rs); err != nil || len(rest) > 0 {
				problem = SignatureFile + " is not an ASN.1 ECDSA signature"
			}
		case ed25519.PublicKey:
			if len(raw) != ed25519.SignatureSize {
				problem = fmt.Sprintf("%s is %d bytes, not an ed25519 signature", SignatureFile, len(raw))
			}
		}
		if problem == "" {
			return "either manifest.json was changed after it was signed, or it was signed by another key"
		}
		if !seen[problem] {
			seen[problem] = true
			malformed = append(malformed, problem)
		}
	}
	return strings.Join(malformed, "; ")
}

// checkPinned accepts exactly <repo>@sha256:<64 hex>: no tag, nothing a
// registry could move under the same name.
func checkPinned(image string) error {
	ref, err := reference.Parse(image)
	if err != nil {
		return err
	}
	c, ok := ref.(reference.Canonical)
	if !ok {
		return errors.New("it has no @sha256: digest")
	}
	if _, tagged := ref.(reference.Tagged); tagged {
		return errors.New("it carries a tag besides its digest")
	}
	if !digestPattern.MatchString(c.Digest().String()) {
		return fmt.Errorf("digest %s is not sha256 and 64 lowercase hex digits", c.Digest())
	}
	if ref.String() != image {
		return fmt.Errorf("it reads as %q", ref.String())
	}
	return nil
}

// WriteRelease writes a signed release into a registry directory the
// legacy way: <dir>/<version>/manifest.json (the manifest as JSON) and
// manifest.json.sig (SignBlob's base64, as `cosign sign-blob --key` wrote it
// before cosign 3). Tests use it for the legacy path.
func WriteRelease(dir string, key crypto.Signer, m Manifest) error {
	return writeSigned(dir, key, m, false)
}

// WriteBundleRelease writes a signed release as cosign 3 signs it:
// <dir>/<version>/manifest.json and manifest.json.sigstore.json, the
// Sigstore bundle (SignBundle). It is how `steward dev` publishes releases;
// a real pipeline uses cosign.
func WriteBundleRelease(dir string, key crypto.Signer, m Manifest) error {
	return writeSigned(dir, key, m, true)
}

func writeSigned(dir string, key crypto.Signer, m Manifest, bundle bool) error {
	rel, err := releasePath(m.Version)
	if err != nil {
		return fmt.Errorf("release manifest: %w", err)
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	raw = append(raw, '\n')
	name, sig := SignatureFile, []byte(nil)
	if bundle {
		name = BundleFile
		sig, err = SignBundle(key, raw)
	} else {
		var s string
		s, err = signing.SignBlob(key, raw)
		sig = []byte(s + "\n")
	}
	if err != nil {
		return fmt.Errorf("sign release %s: %w", m.Version, err)
	}
	folder := filepath.Join(dir, rel)
	if err := os.MkdirAll(folder, 0o755); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(folder, ManifestFile), raw, 0o644); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(folder, name), sig, 0o644)
}

// fetchRelease reads and verifies a release, as the worker does on its
// first delivery of a release.published, and returns it with the evidence
// the stage keeps.
func (w *Worker) fetchRelease(ctx context.Context, ev events.ReleasePublished, installed string) (release, Evidence, error) {
	evd, err := w.cfg.registry.fetch(ctx, ev.Version)
	if err != nil {
		return release{}, Evidence{}, err
	}
	m, digest, err := checkManifest(w.cfg.keys, ev, installed, evd)
	if err != nil {
		return release{}, Evidence{}, err
	}
	return release{Install: w.cfg.Install, Version: m.Version, From: installed, Image: m.OpsImage, ManifestDigest: digest}, evd, nil
}
