package proof

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nats-io/jwt/v2"
)

// Verifier is what a reader believes: keys pinned to writers, and the
// account keys whose user JWTs certify a writer's key.
type Verifier struct {
	pinned  map[string]string // hex key -> writer
	issuers map[string]bool
	derive  func(by string) ed25519.PublicKey
	now     func() time.Time
}

// NewVerifier believes nothing until keys are pinned or issuers trusted.
func NewVerifier() *Verifier {
	return &Verifier{pinned: map[string]string{}, issuers: map[string]bool{}, now: time.Now}
}

// Pin believes pub as by's document key.
func (v *Verifier) Pin(by string, pub ed25519.PublicKey) {
	v.pinned[hex.EncodeToString(pub)] = by
}

// Derive believes, for each writer, the key f gives for its name: for
// tests, where every identity's key is derived from its name
// (workertest). Never for a real bus: anyone who knows f can sign.
func (v *Verifier) Derive(f func(by string) ed25519.PublicKey) { v.derive = f }

// TrustIssuer believes user JWTs signed by the account key (or account
// signing key) issuer, an nkey public key (A…).
func (v *Verifier) TrustIssuer(issuer string) {
	if issuer != "" {
		v.issuers[issuer] = true
	}
}

// TrustIssuerOf trusts the account key that signed the user JWT in the
// credentials file at credsPath: the reader's own credentials name the
// account every identity of its bus is issued from.
func (v *Verifier) TrustIssuerOf(credsPath string) error {
	raw, err := os.ReadFile(credsPath)
	if err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		return fmt.Errorf("credentials %s hold no user JWT: %w", credsPath, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return fmt.Errorf("credentials %s: %w", credsPath, err)
	}
	v.TrustIssuer(uc.Issuer)
	return nil
}

// Verify checks a detached proof of content for scope, by one of writers
// (any writer when none is given).
func (v *Verifier) Verify(scope Scope, p Proof, content []byte, writers ...string) error {
	if p.V != 1 {
		return fmt.Errorf("%w: proof format %d is not one this version reads", ErrForged, p.V)
	}
	if len(writers) > 0 && !slices.Contains(writers, p.By) {
		return fmt.Errorf("%w: written by %s, where only %v write", ErrForged, p.By, writers)
	}
	pub, err := hex.DecodeString(p.Key)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("%w: its key is not an ed25519 key", ErrForged)
	}
	sig, err := base64.StdEncoding.DecodeString(p.Sig)
	if err != nil || !ed25519.Verify(pub, message(scope, p.By, p.N, content), sig) {
		// The most common cause: a document signed for another key or
		// domain, moved here by reflection.
		return fmt.Errorf("%w: its signature by %s does not match %s in %s (it was signed for another key, or changed)", ErrForged, p.By, scope.Key, scope.Bucket)
	}
	if by, ok := v.pinned[p.Key]; ok {
		if by != p.By {
			return fmt.Errorf("%w: the key is %s's, not %s's", ErrForged, by, p.By)
		}
		return nil
	}
	if v.derive != nil && p.Cert == "" {
		if hex.EncodeToString(v.derive(p.By)) != p.Key {
			return fmt.Errorf("%w: the key is not %s's", ErrForged, p.By)
		}
		return nil
	}
	return v.certified(p)
}

// certified checks that p's JWT, signed by a trusted account key, certifies
// p's key for p's writer.
func (v *Verifier) certified(p Proof) error {
	if p.Cert == "" {
		return fmt.Errorf("%w: %s's key is neither pinned here nor certified", ErrForged, p.By)
	}
	uc, err := jwt.DecodeUserClaims(p.Cert)
	if err != nil {
		return fmt.Errorf("%w: %s's certificate is not a user JWT", ErrForged, p.By)
	}
	if !v.issuers[uc.Issuer] {
		return fmt.Errorf("%w: %s's certificate is signed by %s, an account key this reader does not trust", ErrForged, p.By, uc.Issuer)
	}
	if uc.Expires != 0 && v.now().Unix() > uc.Expires {
		return fmt.Errorf("%w: %s's certificate expired", ErrForged, p.By)
	}
	if err := certifies(uc, p.Key, p.By); err != nil {
		return fmt.Errorf("%w: %v", ErrForged, err)
	}
	return nil
}
