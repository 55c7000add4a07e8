package converge

import (
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/steward-dev/steward/internal/signing"
)

// The development instance Dev prepares.
const (
	DevInstall          = "dev"
	DevInstalledVersion = "1.0.0"
	// DevExecCommand shows what the ops job would be given, and nothing
	// more.
	DevExecCommand = `echo converging "$STEWARD_INSTALL" from "$STEWARD_FROM_VERSION" to "$STEWARD_TARGET_VERSION" with "$STEWARD_IMAGE"`
)

// devReleases are the signed sample releases of the development registry:
// two in a row, so a newcomer sees a converge, a refusal of the same
// version, and the next converge.
var devReleases = []Manifest{
	{Schema: ManifestSchema, Version: "1.1.0", MinFromVersion: "1.0.0", OpsImage: devImage("1.1.0"), PublishedAt: "2026-01-15T09:00:00Z"},
	{Schema: ManifestSchema, Version: "1.2.0", MinFromVersion: "1.1.0", OpsImage: devImage("1.2.0"), PublishedAt: "2026-02-15T09:00:00Z"},
}

// devImage is a pinned, made-up image reference: the exec runner only
// prints it.
func devImage(version string) string {
	sum := sha256.Sum256([]byte("steward dev ops image " + version))
	return "ghcr.io/steward-dev/steward-ops@sha256:" + hex.EncodeToString(sum[:])
}

// Dev prepares, under dir, a development release key (ECDSA P-256, as
// `cosign generate-key-pair` makes: keys/cosign.key in cosign's encrypted
// format with an empty password, and keys/cosign.pub) and a registry
// (registry/) holding sample releases signed as cosign 3 signs them (a
// Sigstore bundle beside each manifest), reusing what exists, and returns
// the Config of the development install: the exec runner with a harmless
// command, installed version 1.0.0.
func Dev(ctx context.Context, dir string) (Config, []string, error) {
	keys := filepath.Join(dir, "keys")
	priv, pub := filepath.Join(keys, "cosign.key"), filepath.Join(keys, "cosign.pub")
	reg := filepath.Join(dir, "registry")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	if err := os.MkdirAll(reg, 0o755); err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	// The private key is opened only when a release has to be signed:
	// cosign's format seals it with scrypt, whose 64 MiB would otherwise
	// be allocated on every start for releases that are already signed,
	// and stay resident in an idle dev until the next collection.
	var signer crypto.Signer
	switch privOK, pubOK := fileExists(priv), fileExists(pub); {
	case !privOK && !pubOK:
		var err error
		if signer, err = generateCosignKeyPair(priv, pub, nil); err != nil {
			return Config{}, nil, fmt.Errorf("converge dev: release key: %w", err)
		}
	case privOK != pubOK:
		return Config{}, nil, fmt.Errorf("converge dev: only one of %s and %s exists; remove it so a matching pair is made", priv, pub)
	}
	key, err := signing.LoadPublicKey(pub)
	if err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	for _, m := range devReleases {
		if err := ctx.Err(); err != nil {
			return Config{}, nil, err
		}
		// Keep a release that is there and verifies with this key; sign
		// it again if the key changed or a file is missing.
		if evd, err := (dirRegistry{root: reg}).fetch(ctx, m.Version); err == nil {
			if _, _, err := verifyEvidence(newReleaseKeys(key), m.Version, evd); err == nil {
				continue
			}
		}
		if signer == nil {
			if signer, err = LoadReleaseSigner(priv, nil); err != nil {
				return Config{}, nil, fmt.Errorf("converge dev: %w", err)
			}
		}
		if err := WriteBundleRelease(reg, signer, m); err != nil {
			return Config{}, nil, fmt.Errorf("converge dev: %w", err)
		}
	}
	absReg, err := filepath.Abs(reg)
	if err != nil {
		return Config{}, nil, err
	}
	absPub, err := filepath.Abs(pub)
	if err != nil {
		return Config{}, nil, err
	}
	records, err := filepath.Abs(filepath.Join(dir, "converge-exec"))
	if err != nil {
		return Config{}, nil, err
	}
	cfg := Config{
		// The exec runner's record, so the development instance keeps
		// the same rules as Cloud Run (see execRunner).
		ExecRecordDir:    records,
		Install:          DevInstall,
		Registry:         absReg,
		ReleaseKey:       absPub,
		InstalledVersion: DevInstalledVersion,
		Runner:           RunnerExec,
		ExecCommand:      DevExecCommand,
		TaskTimeout:      DefaultTaskTimeout,
	}
	lines := []string{
		fmt.Sprintf("converge: install %q at %s (first start), exec runner; signed releases 1.1.0 and 1.2.0 in %s, release key %s", DevInstall, DevInstalledVersion, reg, pub),
		fmt.Sprintf("  sign another:       COSIGN_PASSWORD= cosign sign-blob --key %s --use-signing-config=false --tlog-upload=false --bundle <version>/%s <version>/%s", priv, BundleFile, ManifestFile),
		`  converge to 1.1.0:  go run ./cmd/steward publish --type dev.steward.release.published.v1 --data '{"version":"1.1.0"}'`,
		`  then to 1.2.0:      go run ./cmd/steward publish --type dev.steward.release.published.v1 --data '{"version":"1.2.0"}'`,
		"  publishing an installed or older version again shows converge.refused; outcomes are on steward.outcomes.converge." + DevInstall,
	}
	return cfg, lines, nil
}
