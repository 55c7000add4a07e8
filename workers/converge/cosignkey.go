package converge

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/sigstore/pkg/cryptoutils"

	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/signing"
)

// CosignKeyPEMType is the PEM type of the private key files cosign 2 and 3
// write and read (`cosign generate-key-pair`, `cosign sign-blob --key`): a
// PKCS#8 key sealed with scrypt and NaCl secretbox. cosign refuses a plain
// "PRIVATE KEY" block, so the release key Steward writes is this one.
const CosignKeyPEMType = "ENCRYPTED SIGSTORE PRIVATE KEY"

// legacyCosignKeyPEMType is what cosign 1 wrote; it still reads it.
const legacyCosignKeyPEMType = "ENCRYPTED COSIGN PRIVATE KEY"

// GenerateCosignKeyPair writes a new ECDSA P-256 release key the way
// `cosign generate-key-pair` does: privPath (0600) in cosign's encrypted
// format under password (COSIGN_PASSWORD for cosign; it may be empty, as
// cosign allows), pubPath (0644) as PEM PKIX. Existing files are refused,
// so a key in use is never replaced by accident.
func GenerateCosignKeyPair(privPath, pubPath string, password []byte) error {
	_, err := generateCosignKeyPair(privPath, pubPath, password)
	return err
}

// generateCosignKeyPair is GenerateCosignKeyPair returning the key it
// wrote, so a caller that signs with it next need not open the file again
// (scrypt, 64 MiB for a moment).
func generateCosignKeyPair(privPath, pubPath string, password []byte) (crypto.Signer, error) {
	for _, p := range []string{privPath, pubPath} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("%s exists; remove it first if you mean to replace that key", p)
		}
	}
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	privPEM, err := MarshalCosignKey(priv, password)
	if err != nil {
		return nil, err
	}
	pubPEM, err := cryptoutils.MarshalPublicKeyToPEM(priv.Public())
	if err != nil {
		return nil, err
	}
	if err := atomicfile.Write(privPath, privPEM, 0o600); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(pubPath, pubPEM, 0o644); err != nil {
		return nil, err
	}
	return priv, nil
}

// MarshalCosignKey seals priv in cosign's encrypted private key format.
func MarshalCosignKey(priv crypto.Signer, password []byte) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	if password == nil {
		password = []byte{}
	}
	sealed, err := encrypted.Encrypt(der, password)
	if err != nil {
		return nil, fmt.Errorf("seal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: CosignKeyPEMType, Bytes: sealed}), nil
}

// LoadReleaseSigner reads a release signing key: cosign's encrypted format
// (opened with password), or the unencrypted PEM PKCS#8 key older Steward
// versions wrote, so a development folder made before keeps working.
func LoadReleaseSigner(path string, password []byte) (crypto.Signer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read release key: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return nil, fmt.Errorf("release key %s is not PEM", path)
	}
	switch block.Type {
	case CosignKeyPEMType, legacyCosignKeyPEMType:
	default:
		return signing.LoadPrivateKey(path)
	}
	if password == nil {
		password = []byte{}
	}
	der, err := encrypted.Decrypt(block.Bytes, password)
	if err != nil {
		return nil, fmt.Errorf("release key %s does not open with this password (COSIGN_PASSWORD): %w", path, err)
	}
	key, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("release key %s holds no PKCS#8 key: %w", path, err)
	}
	s, ok := key.(crypto.Signer)
	if !ok {
		return nil, errors.New("release key " + path + " cannot sign")
	}
	return s, nil
}
