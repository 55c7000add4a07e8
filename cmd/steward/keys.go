package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/agekey"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/converge"
)

// keyAge is the age identity kind of `steward keys`; the two signing kinds
// are signing's. keyController is an ed25519 pair named for its role: the
// controller's key, which signs credential.rotated and grant.changed.
const (
	keyAge        = "age"
	keyController = "controller"
)

// defaultKeyNames are the file names (before .key and .pub) of each kind.
// The P-256 pair is named as `cosign generate-key-pair` names its own.
var defaultKeyNames = map[string]string{
	string(signing.Ed25519): "ed25519",
	string(signing.P256):    "cosign",
	keyAge:                  "age",
	keyController:           "controller",
}

func newKeysCmd(g *globals) *cobra.Command {
	var dir, name string
	var kindList []string
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Generate development keys: ed25519, ECDSA P-256, age and the controller's",
		Long: `Generate development keys into --dir, each as <name>.key (private, 0600) and
<name>.pub (public, 0644):
  ed25519     signs DSSE envelopes (invitations, host floors); PEM PKCS#8 / PKIX
  ecdsa-p256  signs release manifests like cosign; cosign.pub is PEM PKIX as cosign writes it
  age         an X25519 identity as age-keygen writes it; the .pub file holds the recipient
  controller  ed25519, named controller: signs credential.rotated and grant.changed
              (steward publish/serve --signing-key controller.key); the credential and
              provision workers verify with --controller-key controller.pub
Existing files are never overwritten. To rotate the controller key, make a new
pair under another --name, give the workers both public keys (a comma-separated
--controller-key, or both PEM blocks in one file), sign with the new key, then
remove the old public key from the workers.

Sign a release with cosign 3, offline:
  COSIGN_PASSWORD=... cosign sign-blob --key cosign.key --use-signing-config=false \
    --tlog-upload=false --bundle manifest.json.sigstore.json manifest.json`,
		Example: `  steward keys --dir keys
  steward keys --dir keys --kind age --name hive-h1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(kindList) == 0 {
				return errors.New("--kind: give at least one of ed25519, ecdsa-p256, age, controller")
			}
			for _, k := range kindList {
				if _, ok := defaultKeyNames[k]; !ok {
					return fmt.Errorf("--kind %q: want ed25519, ecdsa-p256, age or controller", k)
				}
			}
			if name != "" && len(kindList) > 1 {
				return errors.New("--name names one key pair: give one --kind with it")
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return fmt.Errorf("--dir: %w", err)
			}
			out := cmd.OutOrStdout()
			for _, k := range slices.Compact(slices.Clone(kindList)) {
				n := name
				if n == "" {
					n = defaultKeyNames[k]
				}
				priv, pub := filepath.Join(dir, n+".key"), filepath.Join(dir, n+".pub")
				if k == keyAge {
					if _, err := os.Stat(pub); err == nil {
						return fmt.Errorf("%s exists; remove it first if you mean to replace that key", pub)
					}
					recipient, err := agekey.Generate(priv)
					if err != nil {
						return fmt.Errorf("age identity: %w", err)
					}
					if err := atomicfile.Write(pub, []byte(recipient+"\n"), 0o644); err != nil {
						return fmt.Errorf("age recipient: %w", err)
					}
					fmt.Fprintf(out, "age identity %s (0600), recipient %s (0644): %s\n", priv, pub, recipient)
					continue
				}
				if k == string(signing.P256) {
					// cosign refuses a plain PKCS#8 "PRIVATE KEY" block, so
					// the release key is sealed the way cosign seals its own.
					password, set := os.LookupEnv("COSIGN_PASSWORD")
					if err := converge.GenerateCosignKeyPair(priv, pub, []byte(password)); err != nil {
						return fmt.Errorf("%s key: %w", k, err)
					}
					note := "sealed with $COSIGN_PASSWORD"
					if !set || password == "" {
						note = "sealed with an empty password (set COSIGN_PASSWORD to choose one)"
					}
					fmt.Fprintf(out, "%s private key %s (0600, cosign format, %s), public key %s (0644)\n", k, priv, note, pub)
					continue
				}
				kind := signing.KeyKind(k)
				if k == keyController {
					kind = signing.Ed25519
				}
				if err := signing.GenerateKeyPair(kind, priv, pub); err != nil {
					return fmt.Errorf("%s key: %w", k, err)
				}
				fmt.Fprintf(out, "%s private key %s (0600), public key %s (0644)\n", k, priv, pub)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dir, "dir", ".steward/keys", "folder to write the keys to (created 0700)")
	fs.StringSliceVar(&kindList, "kind", []string{string(signing.Ed25519), string(signing.P256), keyAge, keyController}, "which keys: ed25519, ecdsa-p256, age, controller (repeat or comma-separate)")
	fs.StringVar(&name, "name", "", "file name before .key/.pub (default ed25519, cosign, age or controller by kind)")
	return cmd
}
