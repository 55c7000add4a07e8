package converge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/steward-dev/steward/events"
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

// DevReleaseCount is how many releases above the installed one the
// development registry holds, each signed: the two the worker's lines
// converge to, the three `steward dev` prints its ways to publish with, and
// one more to go on with.
const DevReleaseCount = 6

// DevState is the development install as the checkpoint bucket holds it
// when dev starts, read and verified before the worker runs, so what dev
// prints follows from the install's state and not from a fixture.
type DevState struct {
	// Version is the installed version: the verified document's, else
	// DevInstalledVersion.
	Version string
	// Said says where Version comes from, or why the document present
	// was not believed.
	Said string
}

// DevStateOf reads the development install's installed-version document as
// the operator's store returned it (events.Store.Get of
// events.StateKey(Name, DevInstall, InstalledDoc)).
func DevStateOf(d events.Doc) DevState {
	first := DevState{Version: DevInstalledVersion, Said: "first start: no installed-version document yet"}
	switch {
	case !d.Present():
		return first
	case !d.Trusted:
		why := "it was not verified"
		if d.Forgery != nil {
			why = d.Forgery.Reason
		}
		return DevState{Version: DevInstalledVersion, Said: fmt.Sprintf("its installed-version document %s is not believed (%s), so the worker rebuilds it from its executions before the next release", d.Key, why)}
	}
	var doc Installed
	if err := d.Decode(&doc); err != nil || events.CheckVersion(doc.Version) != nil {
		return DevState{Version: DevInstalledVersion, Said: fmt.Sprintf("its installed-version document %s does not read as a version, so the worker rebuilds it from its executions before the next release", d.Key)}
	}
	switch {
	case doc.Seed && doc.Version == DevInstalledVersion:
		return DevState{Version: doc.Version, Said: fmt.Sprintf("the seed from --installed-version in %s, signed by %s: no release converged yet", d.Key, d.Info.Writer)}
	case doc.Evidence == nil:
		// The worker believes no other document without evidence
		// (installed): it rebuilds it, and the version it records is
		// the best guess of what the rebuild finds.
		return DevState{Version: doc.Version, Said: fmt.Sprintf("as %s records it, without the signed evidence the worker believes, so it rebuilds it from its executions before the next release", d.Key)}
	}
	return DevState{Version: doc.Version, Said: fmt.Sprintf("recorded in %s, signed by %s, by event %s at %s", d.Key, d.Info.Writer, doc.EventID, doc.UpdatedAt.UTC().Format(time.RFC3339))}
}

// Next are the DevReleaseCount releases above Version, one minor version
// apart (1.3.0, 1.4.0, ... above 1.2.0).
func (st DevState) Next() []string {
	v, err := events.ParseVersion(st.Version)
	if err != nil {
		v, _ = events.ParseVersion(DevInstalledVersion)
	}
	out := make([]string, 0, DevReleaseCount)
	for range DevReleaseCount {
		next := v.IncMinor()
		v = &next
		out = append(out, v.String())
	}
	return out
}

// devManifest is the sample release of version: installable from
// DevInstalledVersion on, so the printed lines converge in whichever order
// they are pasted and only a version at or below the installed one is
// refused; deterministic, so a registry signed again holds the same.
func devManifest(version string) Manifest {
	v, _ := events.ParseVersion(version)
	published := time.Date(2026+int(v.Major())-1, time.Month(v.Minor()), 15, 9, 0, 0, 0, time.UTC)
	return Manifest{Schema: ManifestSchema, Version: version, MinFromVersion: DevInstalledVersion, OpsImage: devImage(version), PublishedAt: published.Format(time.RFC3339)}
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
// command, installed version 1.0.0. It is DevFrom for a first start.
func Dev(ctx context.Context, dir string) (Config, []string, error) {
	return DevFrom(ctx, dir, DevStateOf(events.Doc{}))
}

// DevFrom is Dev for the install in state st: the registry holds, signed,
// the DevReleaseCount releases above st.Version (st.Next), and the lines
// say the installed version and where it comes from, and converge to the
// first two of them.
func DevFrom(ctx context.Context, dir string, st DevState) (Config, []string, error) {
	keys := filepath.Join(dir, "keys")
	priv, pub := filepath.Join(keys, "cosign.key"), filepath.Join(keys, "cosign.pub")
	reg := filepath.Join(dir, "registry")
	if err := os.MkdirAll(keys, 0o700); err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	if err := os.MkdirAll(reg, 0o755); err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	switch privOK, pubOK := fileExists(priv), fileExists(pub); {
	case !privOK && !pubOK:
		if err := GenerateCosignKeyPair(priv, pub, nil); err != nil {
			return Config{}, nil, fmt.Errorf("converge dev: release key: %w", err)
		}
	case privOK != pubOK:
		return Config{}, nil, fmt.Errorf("converge dev: only one of %s and %s exists; remove it so a matching pair is made", priv, pub)
	}
	signer, err := LoadReleaseSigner(priv, nil)
	if err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	key, err := signing.LoadPublicKey(pub)
	if err != nil {
		return Config{}, nil, fmt.Errorf("converge dev: %w", err)
	}
	next := st.Next()
	for _, version := range next {
		m := devManifest(version)
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
	publish := func(v string) string {
		return fmt.Sprintf(`go run ./cmd/steward publish --type %s --data '{"version":"%s"}'`, events.TypeReleasePublished, v)
	}
	lines := []string{
		fmt.Sprintf("converge: install %q at %s (%s), exec runner", DevInstall, st.Version, st.Said),
		fmt.Sprintf("  signed releases %s to %s in %s, release key %s (signed as cosign 3 signs, with %s and an empty password; docs/operations.md signs another)", next[0], next[len(next)-1], reg, pub, priv),
		fmt.Sprintf("  converge to %s:  %s", next[0], publish(next[0])),
		fmt.Sprintf("  then to %s:      %s", next[1], publish(next[1])),
		fmt.Sprintf("  publishing %s or an older version again shows converge.refused with its rule and reason; outcomes are on %s", st.Version, events.OutcomeSubject(Name, DevInstall)),
	}
	return cfg, lines, nil
}
