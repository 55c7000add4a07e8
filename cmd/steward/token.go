package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/tokens"
)

// The ingress and the console sign desired state only for scoped tokens
// (internal/tokens): the operator issues each one as a document signed with
// their document key, into the folder the ingress reads (--tokens-dir), and
// revokes it by removing it.

func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Issue, list and revoke the ingress's scoped tokens",
		Long: `A scoped token is what the ingress (steward serve) and its console sign
credential.rotated and grant.changed for: its document, signed with the
operator's document key and kept in the ingress's --tokens-dir, names the event
types it may publish, the keys (hives, machines; exact or a prefix ending in *),
and the window: how far above the newest signed version or generation stored
on the key a signature may go. The ingress reads the folder on every request,
so a revoked token is refused from the next one. Run as the operator
(--nats-creds operator.creds and the .dockey beside it, or --document-key).`,
	}
	cmd.AddCommand(newTokenIssueCmd(g), newTokenRevokeCmd(), newTokenLsCmd(g))
	return cmd
}

func newTokenIssueCmd(g *globals) *cobra.Command {
	var dir, out, expires string
	var types, keys []string
	var window uint64
	cmd := &cobra.Command{
		Use:   "issue NAME",
		Short: "Issue a scoped token: its document into --dir, its secret once",
		Example: `  steward token issue ci-east --types grant.changed --keys db-1,db-2 --window 5 \
    --dir /etc/steward/tokens --out ci-east.token
  steward token issue rotator --types credential.rotated --keys 'hive-*' --window 1 --dir tokens`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if dir == "" {
				return errors.New("--dir is required: the folder the ingress reads token documents from (its --tokens-dir)")
			}
			doc := tokens.Document{V: 1, Name: name, Keys: keys, Window: window, IssuedAt: time.Now().UTC().Format(time.RFC3339)}
			for _, t := range types {
				doc.Types = append(doc.Types, longType(t))
			}
			if expires != "" {
				d, err := time.ParseDuration(expires)
				if err != nil || d <= 0 {
					return fmt.Errorf("--expires %q: want a duration such as 720h", expires)
				}
				doc.Expires = time.Now().UTC().Add(d).Format(time.RFC3339)
			}
			if _, err := os.Stat(tokens.PathOf(dir, name)); err == nil {
				return fmt.Errorf("token %s exists in %s; revoke it first (steward token revoke %s --dir %s) to issue it again", name, dir, name, dir)
			}
			secret := tokens.NewSecret()
			doc.TokenSHA256 = tokens.HashSecret(secret)
			signer, _, err := g.documentKeys(events.OperatorWriter)
			if err != nil {
				return err
			}
			sealed, err := tokens.Seal(signer, doc)
			if err != nil {
				return err
			}
			// The secret first: a document whose secret was lost is a
			// token nobody holds, while the reverse would be one that
			// works before its holder has it.
			if out != "" {
				if err := atomicfile.WriteNew(out, []byte(secret+"\n"), 0o600); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			if err := tokens.Write(dir, name, sealed); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "issued token %s: %s for %s, window %d", name, strings.Join(types, ", "), strings.Join(keys, ", "), window)
			if doc.Expires != "" {
				fmt.Fprintf(w, ", expires %s", doc.Expires)
			}
			fmt.Fprintf(w, "\ndocument: %s\n", tokens.PathOf(dir, name))
			if out != "" {
				fmt.Fprintf(w, "secret: written to %s (mode 0600); it is not shown again\n", out)
			} else {
				fmt.Fprintf(w, "secret (shown once, never stored): %s\n", secret)
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&dir, "dir", "", "the folder of token documents (the ingress's --tokens-dir)")
	fs.StringVar(&out, "out", "", "write the secret to this new file (mode 0600) instead of printing it")
	fs.StringSliceVar(&types, "types", nil, "event types it may publish (grant.changed, credential.rotated, … or the full type)")
	fs.StringSliceVar(&keys, "keys", nil, "keys it may publish for: hives, machines, or prefixes ending in * ('*' is any)")
	fs.Uint64Var(&window, "window", 0, "how far above the newest signed version or generation stored on a key it may go")
	fs.StringVar(&expires, "expires", "", "how long it lasts (e.g. 720h); default: until revoked")
	return cmd
}

func newTokenRevokeCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a scoped token: the ingress refuses it from its next request",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if dir == "" {
				return errors.New("--dir is required: the folder the ingress reads token documents from")
			}
			if err := tokens.Revoke(dir, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked token %s: its document is gone from %s, and the ingress and console refuse it from their next request\n", args[0], dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the folder of token documents (the ingress's --tokens-dir)")
	return cmd
}

func newTokenLsCmd(g *globals) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the scoped tokens, and any document that is not believed",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("--dir is required: the folder the ingress reads token documents from")
			}
			_, verifier, err := g.documentKeys(g.credsName())
			if err != nil {
				return err
			}
			d, err := tokens.OpenDir(dir, verifier)
			if err != nil {
				return err
			}
			list, err := d.List()
			if err != nil {
				return err
			}
			t := newTable(cmd.OutOrStdout(), "NAME", "TYPES", "KEYS", "WINDOW", "ISSUED", "EXPIRES", "STATE")
			for _, e := range list {
				if e.Err != nil {
					t.row(e.Name, "-", "-", "-", "-", "-", "refused: "+e.Err.Error())
					continue
				}
				state := "current"
				if e.Doc.Expired(time.Now()) {
					state = "expired"
				}
				var short []string
				for _, typ := range e.Doc.Types {
					short = append(short, shortType(typ))
				}
				t.row(e.Name, strings.Join(short, ","), strings.Join(e.Doc.Keys, ","), fmt.Sprint(e.Doc.Window), e.Doc.IssuedAt, e.Doc.Expires, state)
			}
			return t.flush()
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "the folder of token documents (the ingress's --tokens-dir)")
	return cmd
}

// longType takes a type as operators say it (grant.changed) or in full.
func longType(t string) string {
	t = strings.TrimSpace(t)
	if strings.HasPrefix(t, "dev.steward.") {
		return t
	}
	return "dev.steward." + t + ".v1"
}
