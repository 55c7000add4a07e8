package join

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
)

// Names of the development box.
const (
	DevBox        = "dev-box"
	DevDeployment = "dev"
	DevInstanceID = "dev-instance-1"
	DevEnrollment = "dev-enrollment-1"
)

// devArmScript stands in for the host guard's arm command: it checks its
// three files are readable and writes the armed marker, beside itself, with
// the enrollment file's content ({box, enrollment, instanceId}).
const devArmScript = `#!/bin/sh
# Stand-in arm command for steward dev: marks the box armed.
set -eu
policy='' identity='' enrollment=''
while [ $# -gt 0 ]; do
  case "$1" in
    -policy) policy=$2; shift 2 ;;
    -identity) identity=$2; shift 2 ;;
    -enrollment) enrollment=$2; shift 2 ;;
    *) echo "arm: unknown argument $1" >&2; exit 2 ;;
  esac
done
for f in "$policy" "$identity" "$enrollment"; do
  [ -r "$f" ] || { echo "arm: cannot read '$f'" >&2; exit 2; }
done
marker="$(dirname "$0")/armed.json"
cp "$enrollment" "$marker.tmp.$$"
mv -f "$marker.tmp.$$" "$marker"
echo "arm: armed with $enrollment"
`

// Dev prepares, under dir/join, a development box: console and release key
// pairs (reused when present), an identity record and its instance ID file,
// an opt dir, a stand-in arm command, and signed sample event data
// (hostfloor.json, invitation.json) for `steward publish`. It returns the
// box's Config and the lines that tell a newcomer what to publish.
func Dev(ctx context.Context, dir string) (Config, []string, error) {
	if err := ctx.Err(); err != nil {
		return Config{}, nil, err
	}
	base := filepath.Join(dir, "join")
	abs, err := filepath.Abs(base)
	if err != nil {
		return Config{}, nil, err
	}
	if err := os.MkdirAll(filepath.Join(abs, "opt"), 0o700); err != nil {
		return Config{}, nil, fmt.Errorf("dev join: %w", err)
	}
	p := func(name string) string { return filepath.Join(abs, name) }
	for _, name := range []string{"console", "release"} {
		if err := ensureKeyPair(p(name+".key"), p(name+".pub")); err != nil {
			return Config{}, nil, fmt.Errorf("dev join: %w", err)
		}
	}
	if err := ensureFile(p("instance-id"), []byte(DevInstanceID+"\n"), 0o644); err != nil {
		return Config{}, nil, fmt.Errorf("dev join: %w", err)
	}
	rec, err := json.MarshalIndent(IdentityRecord{Box: DevBox, InstanceID: DevInstanceID}, "", "  ")
	if err != nil {
		return Config{}, nil, err
	}
	if err := ensureFile(p("identity.json"), append(rec, '\n'), 0o644); err != nil {
		return Config{}, nil, fmt.Errorf("dev join: %w", err)
	}
	if err := atomicfile.Write(p("arm.sh"), []byte(devArmScript), 0o755); err != nil {
		return Config{}, nil, fmt.Errorf("dev join: %w", err)
	}
	cfg := Config{
		Box:            DevBox,
		Deployment:     DevDeployment,
		ConsoleKey:     p("console.pub"),
		ReleaseKey:     p("release.pub"),
		IdentityRecord: p("identity.json"),
		InstanceIDFile: p("instance-id"),
		OptDir:         p("opt"),
		ArmCommand:     p("arm.sh"),
		ArmedMarker:    p("armed.json"),
	}
	if err := writeDevSamples(cfg, p("console.key"), p("release.key"), p("hostfloor.json"), p("invitation.json")); err != nil {
		return Config{}, nil, fmt.Errorf("dev join: %w", err)
	}
	rel := func(name string) string { return filepath.Join(base, name) }
	lines := []string{
		fmt.Sprintf("join: box %s (deployment %s) arms through %s; the stand-in writes %s", DevBox, DevDeployment, rel("arm.sh"), rel("armed.json")),
		"join: publish the host floor first, then the invitation:",
		"  go run ./cmd/steward publish --type " + events.TypeHostFloorPublished + " --data @" + rel("hostfloor.json"),
		"  go run ./cmd/steward publish --type " + events.TypeInvitationWritten + " --data @" + rel("invitation.json"),
	}
	return cfg, lines, nil
}

// writeDevSamples signs the sample floor and invitation. Both are derived
// from files that are reused (keys, identity record), and ed25519 is
// deterministic, so running Dev again writes the same bytes.
func writeDevSamples(cfg Config, consoleKey, releaseKey, floorPath, invPath string) error {
	rk, err := signing.LoadPrivateKey(releaseKey)
	if err != nil {
		return err
	}
	floor, err := SignHostFloor(rk, events.HostFloor{
		V: 1, Deployment: cfg.Deployment, MinAgentVersion: "1.0.0",
		Binaries: []string{"0000000000000000000000000000000000000000000000000000000000000000"},
	})
	if err != nil {
		return err
	}
	ck, err := signing.LoadPrivateKey(consoleKey)
	if err != nil {
		return err
	}
	evidence, err := EvidenceOf(cfg.IdentityRecord)
	if err != nil {
		return err
	}
	fi, err := os.Stat(cfg.IdentityRecord)
	if err != nil {
		return err
	}
	inv, err := SignInvitation(ck, events.Invitation{
		V: 1, Deployment: cfg.Deployment, Box: cfg.Box, Enrollment: DevEnrollment,
		EvidenceSHA256: evidence,
		// The record's time: stable across runs, and not before the box.
		IssuedAt: fi.ModTime().UTC().Truncate(time.Second).Format(time.RFC3339),
	})
	if err != nil {
		return err
	}
	for path, v := range map[string]any{floorPath: floor, invPath: inv} {
		raw, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := atomicfile.Write(path, append(raw, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ensureKeyPair reuses a whole key pair and makes a new one when neither
// half exists; half a pair is an operator's to sort out.
func ensureKeyPair(priv, pub string) error {
	_, errPriv := os.Stat(priv)
	_, errPub := os.Stat(pub)
	switch {
	case errPriv == nil && errPub == nil:
		return nil
	case errors.Is(errPriv, fs.ErrNotExist) && errors.Is(errPub, fs.ErrNotExist):
		return signing.GenerateKeyPair(signing.Ed25519, priv, pub)
	case errPriv == nil || errPub == nil:
		return fmt.Errorf("only one of %s and %s exists; restore the other or remove both to make a new pair", priv, pub)
	case errPriv != nil && !errors.Is(errPriv, fs.ErrNotExist):
		return errPriv
	default:
		return errPub
	}
}

// ensureFile writes a file only when it is absent, so what a developer
// edited is kept.
func ensureFile(path string, data []byte, perm os.FileMode) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return atomicfile.Write(path, data, perm)
}
