package signing

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/dsse"
)

// KeySet is the set of public keys a verifier trusts for one kind of
// document: a signature by any one of them is enough. A key is rotated by
// adding the new key to the set, signing with it, and removing the old one
// once nothing signed only by the old key is still wanted; during the
// overlap both verify.
type KeySet struct {
	keys []crypto.PublicKey
	ids  []string
	// source names where the keys were read from, for messages.
	source string
}

// LoadPublicKeys reads a key set from spec: one file, or several separated
// by commas, each a PEM file holding one or more PUBLIC KEY blocks (PKIX),
// as `steward keys` and cosign write them; concatenating two .pub files is
// how a set is written. A block of any other type (a private key put there
// by mistake), a key Steward does not take, or a set with no key at all is
// refused. The same key given twice counts once.
func LoadPublicKeys(spec string) (*KeySet, error) {
	ks := &KeySet{source: spec}
	seen := map[string]bool{}
	var files []string
	for f := range strings.SplitSeq(spec, ",") {
		if f = strings.TrimSpace(f); f != "" {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		return nil, errors.New("no public key file given (a PEM file, or several separated by commas)")
	}
	for _, path := range files {
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read public key: %w", err)
		}
		n := 0
		for rest := raw; ; {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				if len(bytes.TrimSpace(rest)) != 0 && n == 0 {
					return nil, fmt.Errorf("public key file %s holds no PEM block", path)
				}
				break
			}
			n++
			if block.Type != "PUBLIC KEY" {
				// The block itself is never quoted: it may be a private key.
				return nil, fmt.Errorf("public key file %s: PEM block %d is a %q, not a PUBLIC KEY; give only public keys to a verifier", path, n, block.Type)
			}
			pub, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("public key file %s: PEM block %d is not a PKIX public key: %w", path, n, err)
			}
			switch pub.(type) {
			case *ecdsa.PublicKey, ed25519.PublicKey:
			default:
				return nil, fmt.Errorf("public key file %s: PEM block %d is a %T; Steward takes ECDSA P-256 or ed25519", path, n, pub)
			}
			id, err := dsse.SHA256KeyID(pub)
			if err != nil {
				return nil, fmt.Errorf("public key file %s: PEM block %d: %w", path, n, err)
			}
			if seen[id] {
				continue
			}
			seen[id] = true
			ks.keys = append(ks.keys, pub)
			ks.ids = append(ks.ids, id)
		}
		if n == 0 {
			return nil, fmt.Errorf("public key file %s holds no PEM PUBLIC KEY block", path)
		}
	}
	return ks, nil
}

// LoadEnvelopeKeys is LoadPublicKeys for keys that verify DSSE envelopes:
// every key must be ed25519.
func LoadEnvelopeKeys(spec string) (*KeySet, error) {
	ks, err := LoadPublicKeys(spec)
	if err != nil {
		return nil, err
	}
	for i, k := range ks.keys {
		if _, ok := k.(ed25519.PublicKey); !ok {
			return nil, fmt.Errorf("key %s of %s is a %T; DSSE envelopes are verified with ed25519", ks.ids[i], spec, k)
		}
	}
	return ks, nil
}

// NewKeySet is the set of the given keys (tests, and callers that hold
// keys already).
func NewKeySet(keys ...crypto.PublicKey) (*KeySet, error) {
	ks := &KeySet{source: "keys given in code"}
	for _, k := range keys {
		id, err := dsse.SHA256KeyID(k)
		if err != nil {
			return nil, fmt.Errorf("key set: %w", err)
		}
		ks.keys = append(ks.keys, k)
		ks.ids = append(ks.ids, id)
	}
	if len(ks.keys) == 0 {
		return nil, errors.New("key set: no key given")
	}
	return ks, nil
}

// Len is how many keys the set holds.
func (s *KeySet) Len() int { return len(s.keys) }

// Keys are the set's public keys, in the order they were given, for a
// verifier that must try each key itself (a Sigstore bundle is verified
// one trusted key at a time).
func (s *KeySet) Keys() []crypto.PublicKey { return append([]crypto.PublicKey(nil), s.keys...) }

// KeyIDs are the DSSE key ids (SSH SHA256 fingerprints) of the set's keys,
// for logs and messages: they name a key without revealing anything.
func (s *KeySet) KeyIDs() []string { return append([]string(nil), s.ids...) }

// String names the set: where it was read from and its key ids.
func (s *KeySet) String() string {
	return fmt.Sprintf("%s (%s)", s.source, strings.Join(s.ids, ", "))
}

// OpenEnvelope verifies a DSSE envelope with the set's ed25519 keys and
// returns its payload and the id of the key that signed it. One valid
// signature by a key of the set is enough; a signature whose keyid names
// another key is not tried against this one. The payload type must be
// payloadType: a valid signature over another kind of document proves
// nothing about this one.
func (s *KeySet) OpenEnvelope(env dsse.Envelope, payloadType string) ([]byte, string, error) {
	if env.PayloadType != payloadType {
		return nil, "", fmt.Errorf("envelope payloadType %.80q, want %q", env.PayloadType, payloadType)
	}
	if len(env.Signatures) == 0 {
		return nil, "", fmt.Errorf("%w: the envelope holds no signature", ErrBadSignature)
	}
	payload, err := env.DecodeB64Payload()
	if err != nil {
		return nil, "", fmt.Errorf("%w: the payload is not base64: %v", ErrBadSignature, err)
	}
	pae := dsse.PAE(env.PayloadType, payload)
	for _, sig := range env.Signatures {
		raw, err := decodeB64(sig.Sig)
		if err != nil {
			continue
		}
		for i, k := range s.keys {
			pub, ok := k.(ed25519.PublicKey)
			if !ok || (sig.KeyID != "" && sig.KeyID != s.ids[i]) {
				continue
			}
			if ed25519.Verify(pub, pae, raw) {
				return payload, s.ids[i], nil
			}
		}
	}
	return nil, "", fmt.Errorf("%w: no signature of the envelope (key ids %s) is by a key of %s", ErrBadSignature, envelopeKeyIDs(env), s)
}

// VerifyBlob checks a cosign-style blob signature with the set: one key
// of the set that verifies it is enough.
func (s *KeySet) VerifyBlob(data []byte, sigB64 string) error {
	var errs []error
	for _, k := range s.keys {
		err := VerifyBlob(k, data, sigB64)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("%w: no key of %s verifies it (%v)", ErrBadSignature, s, errors.Join(errs...))
}

// decodeB64 reads base64 as DSSE allows it: standard or URL alphabet,
// padded or not.
func decodeB64(s string) ([]byte, error) {
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("not base64")
}

func envelopeKeyIDs(env dsse.Envelope) string {
	var ids []string
	for _, s := range env.Signatures {
		id := s.KeyID
		if id == "" {
			id = "none given"
		}
		ids = append(ids, fmt.Sprintf("%.80q", id))
	}
	return strings.Join(ids, ", ")
}

// SignerKeyID is the DSSE key id of a signing key's public half, as the
// envelopes it signs name it.
func SignerKeyID(key crypto.Signer) (string, error) {
	return dsse.SHA256KeyID(key.Public())
}
