package devstack

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/tokens"
	"github.com/steward-dev/steward/workers/credential"
	"github.com/steward-dev/steward/workers/provision"
)

// Where the stack keeps, under Dir, its ingress token, the secret of its
// scoped token, and the scoped tokens' documents.
const (
	TokenFile       = "ingress-token"
	ScopedTokenFile = "scoped-token"
	TokensDir       = "tokens"
)

// ingressToken returns the ingress token kept at path, making it on first
// use.
func ingressToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err == nil {
		if tok := strings.TrimSpace(string(raw)); tok != "" {
			return tok, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("ingress token: %w", err)
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(b)
	if err := atomicfile.Write(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("ingress token: %w", err)
	}
	return tok, nil
}

// scopedToken issues (once) the scoped token "dev" into the tokens folder,
// signed with the operator's document key, for dev's own hive and machine
// with a window of 1000, and returns its secret. The ingress token stays
// unscoped and never has anything signed.
func (s *Stack) scopedToken() (string, error) {
	const name = "dev"
	tokensDir := filepath.Join(s.Dir, TokensDir)
	if err := os.MkdirAll(tokensDir, 0o700); err != nil {
		return "", fmt.Errorf("tokens folder: %w", err)
	}
	if raw, err := os.ReadFile(s.ScopedTokenFile); err == nil {
		if _, err := os.Stat(tokens.PathOf(tokensDir, name)); err == nil {
			return strings.TrimSpace(string(raw)), nil
		}
	}
	signer, _, err := s.id.DocumentKeys(s.OperatorCreds, events.OperatorWriter)
	if err != nil {
		return "", err
	}
	if signer == nil {
		// Operator credentials from before document keys: dev runs, and
		// its ingress and console sign nothing until they are issued again.
		return "", nil
	}
	secret := tokens.NewSecret()
	sealed, err := tokens.Seal(signer, tokens.Document{V: 1, Name: name, TokenSHA256: tokens.HashSecret(secret),
		Types: []string{events.TypeCredentialRotated, events.TypeGrantChanged}, Keys: []string{credential.DevHive, provision.DevMachine},
		Window: 1000, IssuedAt: time.Now().UTC().Format(time.RFC3339)})
	if err != nil {
		return "", err
	}
	if err := atomicfile.Write(s.ScopedTokenFile, []byte(secret+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("scoped token: %w", err)
	}
	if err := tokens.Write(tokensDir, name, sealed); err != nil {
		return "", err
	}
	return secret, nil
}
