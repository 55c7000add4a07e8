package credential

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
)

// DevHive is the hive of the development instance `steward dev` runs.
const DevHive = "dev-hive"

// Dev prepares a development credential worker under dir/credential: an age
// identity (identity.txt, made once and reused), the credential directory
// (files/) and a sample secret file (dev-secret.txt) to publish; the worker
// verifies rotations with dev's controller key (dir/controller.pub, see
// signing.DevControllerKey). It returns the Config and the lines that tell
// a newcomer how to publish a rotation, signed with dir/controller.key.
func Dev(ctx context.Context, dir string) (Config, []string, error) {
	if err := ctx.Err(); err != nil {
		return Config{}, nil, err
	}
	base := filepath.Join(dir, "credential")
	cfg := Config{
		Hive:          DevHive,
		AgeIdentity:   filepath.Join(base, "identity.txt"),
		CredentialDir: filepath.Join(base, "files"),
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return Config{}, nil, fmt.Errorf("dev credential worker: %w", err)
	}
	signingKey, controllerPub, err := signing.DevControllerKey(dir)
	if err != nil {
		return Config{}, nil, fmt.Errorf("dev credential worker: %w", err)
	}
	cfg.ControllerKey = controllerPub
	if err := os.MkdirAll(cfg.CredentialDir, 0o755); err != nil {
		return Config{}, nil, fmt.Errorf("dev credential worker: %w", err)
	}
	id, _, err := agekey.LoadOrGenerate(cfg.AgeIdentity)
	if err != nil {
		return Config{}, nil, fmt.Errorf("dev credential worker: %w", err)
	}
	recipient := id.Recipients()[0]
	secretFile := filepath.Join(base, "dev-secret.txt")
	if _, err := os.Stat(secretFile); errors.Is(err, fs.ErrNotExist) {
		b := make([]byte, 16)
		rand.Read(b)
		if err := atomicfile.WriteNew(secretFile, []byte("dev-secret-"+hex.EncodeToString(b)), 0o600); err != nil && !errors.Is(err, fs.ErrExist) {
			return Config{}, nil, fmt.Errorf("dev credential worker: %w", err)
		}
	} else if err != nil {
		return Config{}, nil, fmt.Errorf("dev credential worker: %w", err)
	}
	lines := []string{
		fmt.Sprintf("credential: hive %s writes %s/{%s,%s}; its age recipient is %s", DevHive, cfg.CredentialDir, ClientIDFile, SecretFile, recipient),
		fmt.Sprintf(`  rotate it: go run ./cmd/steward publish --type dev.steward.credential.rotated.v1 --data '{"hive":"%s","version":1,"clientId":"dev-client"}' --secret-file %s --recipient %s --signing-key %s`, DevHive, secretFile, recipient, signingKey),
		"  (raise \"version\" for every new rotation: one not above the applied version is skipped; one not signed by a key of " + controllerPub + " is refused)",
	}
	return cfg, lines, nil
}
