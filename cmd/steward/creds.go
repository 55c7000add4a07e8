package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
)

func newCredsCmd(_ *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "creds",
		Short: "Issue NATS credentials scoped to one role or worker instance",
		Long: `Steward's bus is closed: NATS runs with decentralised JWT authentication, and
every process connects with credentials scoped to what its role does.

  operator          the whole JetStream API: steward setup, dlq, status, replay, export
  publisher         publishes steward.events.> and nothing else (consoles, the ingress)
  <worker> <inst>   one worker instance: its own consumer, acks, checkpoint, stage
                    and status keys, outcomes and dead letters
  leaf <site>       a site's leaf node linking to the hub: its own site's sourcing,
                    resets and reads of the site's JetStream, nothing of another
                    site's nor any steward.> subject (steward site config --leaf-creds)

'creds init' makes an operator, the STEWARD account with a signing key, and the
system account (seeds 0600 in --dir), and the files a nats-server needs.
'creds issue' signs a user with the account signing key; no server
configuration changes for a new instance.`,
	}
	cmd.AddCommand(newCredsInitCmd(), newCredsIssueCmd())
	return cmd
}

func newCredsInitCmd() *cobra.Command {
	var dir, serverDir string
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Make the operator, the account and its signing key, kept in --dir (kept when they exist)",
		Long: `Make the NATS authority Steward's credentials are issued from, or read it
when --dir holds one: operator.nk, account.nk, signing.nk and system.nk (seeds,
0600), account.pub, and the server's files: operator.jwt and accounts/<key>.jwt.
--server-dir writes the server's files (no seed) there too, for a server that
must not see the seeds. The server is configured with

  operator: <server-dir>/operator.jwt
  resolver: { type: full, dir: <server-dir>/accounts }`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := natsauth.LoadOrCreate(dir)
			if err != nil {
				return err
			}
			if serverDir != "" {
				if err := a.WriteServerFiles(serverDir); err != nil {
					return err
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "NATS authority in %s: account %s (%s), system account %s\n", dir, natsauth.AccountName, a.AccountPublic, a.SystemPublic)
			if serverDir != "" {
				fmt.Fprintf(out, "server files in %s: %s and %s/\n", serverDir, natsauth.OperatorJWTFile, natsauth.ResolverDir)
			}
			fmt.Fprintf(out, "issue credentials with: steward creds issue <worker> <instance> --account-seed %s --out <file>\n", filepath.Join(dir, natsauth.SigningSeedFile))
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "nats-auth", "folder of the authority's seeds and files")
	cmd.Flags().StringVar(&serverDir, "server-dir", "", "also write the server's files (operator.jwt, accounts/) here")
	return cmd
}

func newCredsIssueCmd() *cobra.Command {
	var seedFile, account, out, hubDomain string
	var newKey bool
	cmd := &cobra.Command{
		Use:   "issue operator | publisher | <worker> <instance> | leaf <site>",
		Short: "Write a .creds file for the operator, a publisher, one worker instance or a site's leaf node",
		Long: `Write NATS credentials (a user JWT signed with the account signing key, and the
user's own nkey seed) scoped to one identity, to --out (0600, atomically; a file
there is replaced), and the identity's document key beside it (<name>.dockey,
0600; an existing one is kept). Everything the identity stores (checkpoints,
stages, cursors, pauses, status, outcomes) is signed with the document key, and
the JWT certifies it (tags steward-dockey, steward-role, steward-worker,
steward-instance), so readers believe only the writer they expect. The server needs no change: it trusts the account, and the
account trusts its signing key.

  steward creds issue converge install-7 --account-seed nats-auth/signing.nk --out converge-install-7.creds
  steward creds issue publisher --account-seed nats-auth/signing.nk --out publisher.creds
  steward creds issue leaf site-a --account-seed nats-auth/signing.nk --out leaf-site-a.creds

A site's leaf node stores nothing of its own: its credentials get no document
key. Its permissions name the site and the hub's JetStream domain
(--hub-domain), and rely on the hub and the leaf running nats-server 2.15 with
feature_flags { js_api_reply_v2: true } (steward site config writes it for the
leaf; the hub's configuration must have it too).

The worker connects with STEWARD_NATS_CREDS=<file>; its inbox prefix is read
from the credentials.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := credsIdentity(args, hubDomain)
			if err != nil {
				return err
			}
			if seedFile == "" {
				return errors.New("--account-seed is required: the account signing key's seed file (signing.nk, made by steward creds init)")
			}
			seed, err := os.ReadFile(seedFile)
			if err != nil {
				return fmt.Errorf("--account-seed: %w", err)
			}
			acct, err := accountOf(account, seedFile)
			if err != nil {
				return err
			}
			if out == "" {
				out = id.Name() + ".creds"
			}
			if id.Role == natsauth.RoleLeaf {
				creds, err := natsauth.IssueCreds(seed, acct, id, nil)
				if err != nil {
					return fmt.Errorf("--account-seed %s: %w", seedFile, err)
				}
				if err := atomicfile.Write(out, creds, 0o600); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "credentials of %s (the leaf node of site %s, sourcing from domain %s) written to %s (0600); give them to steward site config --leaf-creds %s\n",
					id.Name(), id.Site, id.HubDomain, out, out)
				return nil
			}
			keyPath := proof.KeyFileFor(out)
			if newKey {
				if err := os.Remove(keyPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("--new-document-key: %w", err)
				}
			}
			docKey, err := natsauth.DocumentKey(keyPath)
			if err != nil {
				return err
			}
			creds, err := natsauth.IssueCreds(seed, acct, id, docKey.Public().(ed25519.PublicKey))
			if err != nil {
				return fmt.Errorf("--account-seed %s: %w", seedFile, err)
			}
			if err := atomicfile.Write(out, creds, 0o600); err != nil {
				return fmt.Errorf("--out: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "credentials of %s (%s) written to %s (0600), its document key to %s (0600, kept beside them); use them with STEWARD_NATS_CREDS=%s or nats --creds %s\n",
				id.Name(), id.Role, out, keyPath, out, out)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&seedFile, "account-seed", "", "seed file of the account's signing key (or of the account itself)")
	fs.StringVar(&account, "account", "", "the account's public key, or a file holding it (empty: account.pub beside --account-seed, else the seed is the account's own)")
	fs.StringVar(&out, "out", "", "where to write the credentials (empty: <name>.creds here); the document key goes beside them as <name>.dockey")
	fs.StringVar(&hubDomain, "hub-domain", events.DefaultHubDomain, "with leaf: the hub's JetStream domain the site sources from")
	fs.BoolVar(&newKey, "new-document-key", false, "replace the document key beside --out (after a compromise: documents signed by the old key stop verifying and fall back, docs/design.md §7)")
	return cmd
}

// credsIdentity reads `creds issue`'s arguments.
func credsIdentity(args []string, hubDomain string) (natsauth.Identity, error) {
	if len(args) == 2 && args[0] == string(natsauth.RoleLeaf) {
		return natsauth.Leaf(args[1], hubDomain)
	}
	if len(args) == 1 {
		switch args[0] {
		case string(natsauth.RoleOperator):
			return natsauth.Operator(), nil
		case string(natsauth.RolePublisher):
			return natsauth.Publisher(), nil
		}
		return natsauth.Identity{}, fmt.Errorf("%q: want operator, publisher, leaf and a site, or a worker and its instance (%s)", args[0], strings.Join(kindNames(), ", "))
	}
	if !slices.Contains(kindNames(), args[0]) {
		return natsauth.Identity{}, fmt.Errorf("worker %q: want one of %s", args[0], strings.Join(kindNames(), ", "))
	}
	return natsauth.Worker(args[0], args[1])
}

func kindNames() []string {
	var out []string
	for _, k := range kinds {
		out = append(out, k.name)
	}
	return out
}

// accountOf is --account: a public key, a file holding one, or the
// account.pub beside the seed file.
func accountOf(flag, seedFile string) (string, error) {
	if strings.HasPrefix(flag, "A") && !strings.ContainsAny(flag, "/.") {
		return flag, nil
	}
	path := flag
	if path == "" {
		path = filepath.Join(filepath.Dir(seedFile), natsauth.AccountPubFile)
	}
	raw, err := os.ReadFile(path)
	switch {
	case err == nil:
		return strings.TrimSpace(string(raw)), nil
	case flag == "" && errors.Is(err, fs.ErrNotExist):
		return "", nil
	}
	return "", fmt.Errorf("--account: %w", err)
}
