package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/internal/signing"
)

// Every document Steward stores is signed by its writer's document key and
// believed only as its expected writer's (docs/design.md §7). A process
// signs with --document-key (by default the .dockey beside --nats-creds,
// which steward creds issue and steward dev write) and believes keys that
// the account of its own credentials certifies, plus the keys pinned with
// --document-trust, for identities without a JWT.

// documentKeys are the signer (nil when there is no document key) and the
// verifier of an identity named by (the name its credentials carry:
// "operator", "<worker>-<instance>"). With no credentials, no pinned keys
// and no document key (an open development bus) the verifier is nil: the
// operators' tools then show documents as not verified, never as forged,
// and a worker believes only its own key.
func (g *globals) documentKeys(by string) (*proof.Signer, *proof.Verifier, error) {
	if g.natsCreds == "" && g.documentTrust == "" && g.documentKey == "" {
		return nil, nil, nil
	}
	v := proof.NewVerifier()
	if g.natsCreds != "" {
		if err := v.TrustIssuerOf(g.natsCreds); err != nil {
			return nil, nil, fmt.Errorf("--nats-creds: %w", err)
		}
	}
	for entry := range strings.SplitSeq(g.documentTrust, ",") {
		if entry = strings.TrimSpace(entry); entry == "" {
			continue
		}
		writer, path, ok := strings.Cut(entry, "=")
		if !ok || writer == "" || path == "" {
			return nil, nil, fmt.Errorf("--document-trust %q: want <writer>=<public key file> (operator=operator.pub, join-box-7=join-box-7.pub), separated by commas", entry)
		}
		pub, err := signing.LoadPublicKey(path)
		if err != nil {
			return nil, nil, fmt.Errorf("--document-trust %s: %w", writer, err)
		}
		ed, ok := pub.(ed25519.PublicKey)
		if !ok {
			return nil, nil, fmt.Errorf("--document-trust %s: %s holds a %T; document keys are ed25519", writer, path, pub)
		}
		v.Pin(writer, ed)
	}
	path := g.documentKey
	if path == "" && g.natsCreds != "" {
		path = proof.KeyFileFor(g.natsCreds)
	}
	if path == "" {
		return nil, v, nil
	}
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) && g.documentKey == "" {
		// Credentials issued before document keys: the identity reads,
		// and signs nothing until it is issued again.
		return nil, v, nil
	}
	var s *proof.Signer
	var err error
	if g.natsCreds != "" {
		s, err = proof.LoadSigner(path, g.natsCreds, by)
	} else if k, kerr := proof.LoadKey(path); kerr == nil {
		s = proof.NewSigner(k, by, "")
	} else {
		err = kerr
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--document-key: %w", err)
	}
	v.Pin(by, s.Public())
	return s, v, nil
}

// credsName is the identity the credentials name ("operator" when there
// are none, or they cannot be read: the tools act as the operator).
func (g *globals) credsName() string {
	if g.natsCreds == "" {
		return events.OperatorWriter
	}
	raw, err := os.ReadFile(g.natsCreds)
	if err != nil {
		return events.OperatorWriter
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		return events.OperatorWriter
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil || uc.Name == "" {
		return events.OperatorWriter
	}
	return uc.Name
}

// documents opens the checkpoint bucket as this command's identity, for
// the operators' tools: nil (and no error) when the bucket does not exist
// yet.
func (g *globals) documents(ctx context.Context, js jetstream.JetStream) (*events.Store, error) {
	signer, verifier, err := g.documentKeys(g.credsName())
	if err != nil {
		return nil, err
	}
	s, err := events.OpenStore(ctx, js, events.StoreOptions{Signer: signer, Verifier: verifier, Domain: g.jsDomain})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	return s, err
}

// proofs is what this command checks outcomes and dead letters with: the
// keys its identity believes, in its domain, with the upgrade record's
// time when the bucket holds one (unsigned messages stored before it are
// the previous version's). A command with no credentials, no
// --document-trust and no document key believes no one, so it marks them
// unverified rather than calling every one forged.
func (g *globals) proofs(ctx context.Context, js jetstream.JetStream) (ops.Proofs, error) {
	s, err := g.documents(ctx, js)
	if err != nil {
		return ops.Proofs{}, err
	}
	if s != nil {
		return ops.ProofsOf(s), nil
	}
	// No bucket yet, so no upgrade record: the keys still check messages.
	_, verifier, err := g.documentKeys(g.credsName())
	return ops.Proofs{Verifier: verifier, Domain: g.jsDomain}, err
}
