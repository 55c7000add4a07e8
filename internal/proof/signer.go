package proof

import (
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/sigstore/sigstore/pkg/cryptoutils"

	"github.com/steward-dev/steward/internal/atomicfile"
)

// Signer signs documents as one writer with its document key.
type Signer struct {
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
	by   string
	// head is a proof's JSON up to its counter, and tail the rest up to
	// its signature (the certificate, if any), marshalled once: two
	// proofs by one signer differ only in those two, and a worker signs a
	// checkpoint for every event, so building the whole object each time
	// was most of what a signature allocated (AppendProof).
	head, tail []byte
}

// NewSigner signs as by with priv; cert is by's user JWT certifying the
// key (empty when readers have the key pinned instead).
func NewSigner(priv ed25519.PrivateKey, by, cert string) *Signer {
	s := &Signer{priv: priv, pub: priv.Public().(ed25519.PublicKey), by: by}
	// A string always marshals; json.Marshal escapes it as it would in
	// the Proof struct, so the bytes are the struct's.
	byJSON, _ := json.Marshal(by)
	s.head = fmt.Appendf(nil, `{"v":1,"by":%s,"key":"%s","n":`, byJSON, hex.EncodeToString(s.pub))
	if cert != "" {
		certJSON, _ := json.Marshal(cert)
		s.tail = append(append(s.tail, `,"cert":`...), certJSON...)
	}
	s.tail = append(s.tail, `,"sig":"`...)
	return s
}

// By names the writer.
func (s *Signer) By() string { return s.by }

// Public is the document key's public half.
func (s *Signer) Public() ed25519.PublicKey { return s.pub }

// KeyFileFor is where the document key of a credentials file is kept:
// beside it, "<name>.dockey" for "<name>.creds".
func KeyFileFor(credsPath string) string {
	return strings.TrimSuffix(credsPath, filepath.Ext(credsPath)) + ".dockey"
}

// GenerateKey makes a document key and writes it to path (PEM PKCS#8, 0600,
// atomically). An existing file is refused: replacing a key in use makes
// every document signed by it unverifiable to readers that pinned it.
func GenerateKey(path string) (ed25519.PrivateKey, error) {
	if _, err := os.Stat(path); err == nil {
		return nil, fmt.Errorf("document key %s exists; remove it first if you mean to replace it", path)
	}
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		return nil, err
	}
	raw, err := cryptoutils.MarshalPrivateKeyToPEM(priv)
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(path, raw, 0o600); err != nil {
		return nil, fmt.Errorf("document key: %w", err)
	}
	return priv, nil
}

// LoadKey reads a document key (PEM PKCS#8 ed25519).
func LoadKey(path string) (ed25519.PrivateKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("document key: %w", err)
	}
	k, err := cryptoutils.UnmarshalPEMToPrivateKey(raw, cryptoutils.SkipPassword)
	if err != nil {
		// The parser's error is not quoted: it may quote the file.
		return nil, fmt.Errorf("document key %s is not an unencrypted PEM PKCS#8 key", path)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("document key %s is a %T; a document key is ed25519", path, k)
	}
	return priv, nil
}

// LoadSigner reads the document key at keyPath and the user JWT in the
// credentials file credsPath, and checks that the JWT certifies the key for
// by: a signer whose documents no reader could verify is refused at start,
// not found out at the first read.
func LoadSigner(keyPath, credsPath, by string) (*Signer, error) {
	priv, err := LoadKey(keyPath)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(credsPath)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	token, err := jwt.ParseDecoratedJWT(raw)
	if err != nil {
		return nil, fmt.Errorf("credentials %s hold no user JWT: %w", credsPath, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", credsPath, err)
	}
	s := NewSigner(priv, by, token)
	if err := certifies(uc, hex.EncodeToString(s.pub), by); err != nil {
		return nil, fmt.Errorf("the credentials %s do not certify the document key %s: %w; issue both again with steward creds issue", credsPath, keyPath, err)
	}
	return s, nil
}

// Tags a user JWT carries to certify a document key.
const (
	// TagKey names the document key (hex) of the user.
	TagKey = "steward-dockey:"
	// TagRole, TagWorker and TagInstance name the identity. JWT tags are
	// lower-cased, so the exact instance is the JWT's name.
	TagRole     = "steward-role:"
	TagWorker   = "steward-worker:"
	TagInstance = "steward-instance:"
)

// certifies checks that uc names key as the document key of by.
func certifies(uc *jwt.UserClaims, key, by string) error {
	if !uc.Tags.Contains(TagKey + key) {
		return errors.New("the JWT names another document key")
	}
	if uc.Name != by {
		return fmt.Errorf("the JWT is %q's, not %q's", uc.Name, by)
	}
	return nil
}
