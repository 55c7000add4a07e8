package converge

import (
	"bytes"
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
	"io"
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
)

// refusal is a release the worker will not converge to, whatever a retry
// does: it becomes a refused outcome and a dead letter.
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
// signature, manifest.json.sig, is what `cosign sign-blob --key` writes for
// the file's exact bytes.
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
	Install        string
	Version        string
	From           string
	Image          string
	ManifestDigest string
	logger         zerolog.Logger
}

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// checkManifest verifies a release's manifest bytes and signature and
// decides whether an install at installed may move to it. Every "no" is a
// *refusal saying what was found and what follows.
func checkManifest(key crypto.PublicKey, keyID string, ev events.ReleasePublished, installed string, raw, sig []byte) (Manifest, string, error) {
	var m Manifest
	if err := signing.VerifyBlob(key, raw, string(sig)); err != nil {
		return m, "", refuse(ruleSignature, "the manifest of release %s does not verify against the release key %s (%s), so it is not trusted and nothing ran", ev.Version, keyID, signatureProblem(key, sig))
	}
	sum := sha256.Sum256(raw)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	if ev.ManifestDigest != "" && ev.ManifestDigest != digest {
		return m, "", refuse(ruleDigest, "the event names manifest digest %s but release %s's signed manifest in the registry is %s; the event and the registry disagree, so nothing ran", ev.ManifestDigest, ev.Version, digest)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s is not a schema %d manifest: %v", ev.Version, ManifestSchema, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has data after its JSON object", ev.Version)
	}
	if m.Schema != ManifestSchema {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has schema %d; this worker reads schema %d only", ev.Version, m.Schema, ManifestSchema)
	}
	if m.Version != ev.Version {
		return m, "", refuse(ruleVersionMismatch, "the event names release %s but the signed manifest at %s/%s is for version %q; a manifest is only good for its own version, so nothing ran", ev.Version, ev.Version, ManifestFile, m.Version)
	}
	if err := checkPinned(m.OpsImage); err != nil {
		return m, "", refuse(ruleUnpinned, "release %s's opsImage %q is not pinned by digest (%v); only <repo>@sha256:<64 hex> runs, so nothing ran", ev.Version, m.OpsImage, err)
	}
	if _, err := time.Parse(time.RFC3339, m.PublishedAt); err != nil {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has publishedAt %q, not an RFC 3339 time", ev.Version, m.PublishedAt)
	}
	minFrom, err := events.ParseVersion(m.MinFromVersion)
	if err != nil {
		return m, "", refuse(ruleManifest, "the signed manifest of release %s has minFromVersion %q: %v", ev.Version, m.MinFromVersion, err)
	}
	target, err := events.ParseVersion(m.Version)
	if err != nil {
		return m, "", refuse(ruleVersionFormat, "release %s: %v", ev.Version, err)
	}
	cur, err := events.ParseVersion(installed)
	if err != nil {
		return m, "", fmt.Errorf("the recorded installed version %q is not a semantic version: %w", installed, err)
	}
	switch c := target.Compare(cur); {
	case c < 0:
		return m, "", refuse(ruleDowngrade, "release %s is older than the installed %s; a downgrade is never applied, so %s stays installed", ev.Version, installed, installed)
	case c == 0:
		return m, "", refuse(ruleSameVersion, "release %s is the installed version (%s); there is nothing to converge", ev.Version, installed)
	}
	if minFrom.Compare(cur) > 0 {
		return m, "", refuse(ruleMinFrom, "release %s needs at least %s installed but %s is; install the releases in between first, %s stays installed", ev.Version, m.MinFromVersion, installed, installed)
	}
	return m, digest, nil
}

// signatureProblem says why a signature did not verify, as far as can be
// told: a file that is no signature at all, or a signature that belongs to
// other bytes or another key (which no one can tell apart).
func signatureProblem(key crypto.PublicKey, sig []byte) string {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(sig)))
	if err != nil {
		return SignatureFile + " is not base64"
	}
	switch key.(type) {
	case *ecdsa.PublicKey:
		var rs struct{ R, S *big.Int }
		if rest, err := asn1.Unmarshal(raw, &rs); err != nil || len(rest) > 0 {
			return SignatureFile + " is not an ASN.1 ECDSA signature"
		}
	case ed25519.PublicKey:
		if len(raw) != ed25519.SignatureSize {
			return fmt.Sprintf("%s is %d bytes, not an ed25519 signature", SignatureFile, len(raw))
		}
	}
	return "either manifest.json was changed after it was signed, or it was signed by another key"
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

// WriteRelease writes a signed release into a registry directory:
// <dir>/<version>/manifest.json (the manifest as JSON) and manifest.json.sig
// (SignBlob's base64, as `cosign sign-blob --key` writes it). It is how
// `steward dev` and tests publish releases; a real pipeline uses cosign.
func WriteRelease(dir string, key crypto.Signer, m Manifest) error {
	rel, err := releasePath(m.Version)
	if err != nil {
		return fmt.Errorf("release manifest: %w", err)
	}
	raw, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	raw = append(raw, '\n')
	sig, err := signing.SignBlob(key, raw)
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
	return atomicfile.Write(filepath.Join(folder, SignatureFile), []byte(sig+"\n"), 0o644)
}

// fetchRelease reads and verifies a release, as the worker does on its
// first delivery of a release.published.
func (w *Worker) fetchRelease(ctx context.Context, ev events.ReleasePublished, installed string) (release, error) {
	raw, sig, err := w.cfg.registry.fetch(ctx, ev.Version)
	if err != nil {
		return release{}, err
	}
	m, digest, err := checkManifest(w.cfg.key, w.cfg.keyID, ev, installed, raw, sig)
	if err != nil {
		return release{}, err
	}
	return release{Install: w.cfg.Install, Version: m.Version, From: installed, Image: m.OpsImage, ManifestDigest: digest}, nil
}
