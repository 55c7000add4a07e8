// Package signing loads Steward's keys and makes and checks its two kinds of
// signature: cosign-style blob signatures over release manifests, and DSSE
// envelopes over invitations and host floors.
package signing

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// LoadPublicKey reads a PEM (PKIX) public key file, as cosign.pub is written.
func LoadPublicKey(path string) (crypto.PublicKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read public key: %w", err)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(raw)
	if err != nil {
		return nil, fmt.Errorf("public key %s is not a PEM PKIX public key: %w", path, err)
	}
	switch pub.(type) {
	case *ecdsa.PublicKey, ed25519.PublicKey:
		return pub, nil
	}
	return nil, fmt.Errorf("public key %s is a %T; Steward takes ECDSA P-256 or ed25519", path, pub)
}

// LoadPrivateKey reads an unencrypted PEM (PKCS#8) private key file.
func LoadPrivateKey(path string) (crypto.Signer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read private key: %w", err)
	}
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(raw, cryptoutils.SkipPassword)
	if err != nil {
		return nil, fmt.Errorf("private key %s is not an unencrypted PEM PKCS#8 key: %w", path, err)
	}
	s, ok := priv.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key %s (%T) cannot sign", path, priv)
	}
	return s, nil
}

// KeyKind is a kind of key Steward generates.
type KeyKind string

// The key kinds: ed25519 signs DSSE envelopes; ECDSA P-256 signs release
// manifests the way `cosign generate-key-pair` keys do.
const (
	Ed25519 KeyKind = "ed25519"
	P256    KeyKind = "ecdsa-p256"
)

// GenerateKeyPair writes a new private key (PEM PKCS#8, 0600) to privPath and
// its public key (PEM PKIX, 0644) to pubPath. Existing files are refused, so a
// key in use is never replaced by accident.
func GenerateKeyPair(kind KeyKind, privPath, pubPath string) error {
	for _, p := range []string{privPath, pubPath} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists; remove it first if you mean to replace that key", p)
		}
	}
	var priv crypto.Signer
	var err error
	switch kind {
	case Ed25519:
		_, priv, err = ed25519.GenerateKey(rand.Reader)
	case P256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		return fmt.Errorf("key kind %q: Steward makes %s or %s", kind, Ed25519, P256)
	}
	if err != nil {
		return err
	}
	privPEM, err := cryptoutils.MarshalPrivateKeyToPEM(priv)
	if err != nil {
		return err
	}
	pubPEM, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		return err
	}
	if err := atomicfile.Write(privPath, privPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(pubPath, pubPEM, 0o644)
}

// SignBlob signs data as `cosign sign-blob --key` does: ECDSA over the
// SHA-256 of the bytes (ASN.1), or plain ed25519, returned base64-encoded.
func SignBlob(key crypto.Signer, data []byte) (string, error) {
	s, err := signature.LoadSigner(key, crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("load signer: %w", err)
	}
	sig, err := s.SignMessage(bytes.NewReader(data))
	if err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}

// ErrBadSignature says a signature did not verify against the given key.
var ErrBadSignature = errors.New("signature does not verify")

// VerifyBlob checks a base64 signature as `cosign verify-blob --key` does.
func VerifyBlob(pub crypto.PublicKey, data []byte, sigB64 string) error {
	sig, err := base64.StdEncoding.DecodeString(strings.TrimSpace(sigB64))
	if err != nil {
		return fmt.Errorf("%w: the signature is not base64: %v", ErrBadSignature, err)
	}
	v, err := signature.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return fmt.Errorf("load verifier: %w", err)
	}
	if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(data)); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return nil
}

// ed25519Key adapts an ed25519 key to DSSE's Signer and Verifier. Its key id
// is DSSE's SHA-256 of the PKIX public key.
type ed25519Key struct {
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
}

func (k ed25519Key) Sign(_ context.Context, data []byte) ([]byte, error) {
	return ed25519.Sign(k.priv, data), nil
}

func (k ed25519Key) Verify(_ context.Context, data, sig []byte) error {
	if !ed25519.Verify(k.pub, data, sig) {
		return ErrBadSignature
	}
	return nil
}

func (k ed25519Key) KeyID() (string, error)   { return dsse.SHA256KeyID(k.pub) }
func (k ed25519Key) Public() crypto.PublicKey { return k.pub }

// SignEnvelope wraps payload in a DSSE envelope signed with an ed25519 key.
func SignEnvelope(key crypto.Signer, payloadType string, payload []byte) (dsse.Envelope, error) {
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return dsse.Envelope{}, fmt.Errorf("DSSE envelopes are signed with ed25519, not %T", key)
	}
	s, err := dsse.NewEnvelopeSigner(ed25519Key{priv: priv, pub: priv.Public().(ed25519.PublicKey)})
	if err != nil {
		return dsse.Envelope{}, err
	}
	env, err := s.SignPayload(context.Background(), payloadType, payload)
	if err != nil {
		return dsse.Envelope{}, err
	}
	return *env, nil
}

// OpenEnvelope verifies a DSSE envelope with an ed25519 public key and
// returns its payload. The payload type must be payloadType: a valid
// signature over another kind of document is no invitation.
func OpenEnvelope(pub crypto.PublicKey, env dsse.Envelope, payloadType string) ([]byte, error) {
	edPub, ok := pub.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("DSSE envelopes are verified with ed25519, not %T", pub)
	}
	if env.PayloadType != payloadType {
		return nil, fmt.Errorf("envelope payloadType %q, want %q", env.PayloadType, payloadType)
	}
	v, err := dsse.NewEnvelopeVerifier(ed25519Key{pub: edPub})
	if err != nil {
		return nil, err
	}
	_, payload, err := v.VerifyAndDecode(context.Background(), &env)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return payload, nil
}
