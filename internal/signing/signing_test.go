package signing

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func keyPair(t *testing.T, kind KeyKind) (priv, pub string) {
	t.Helper()
	dir := t.TempDir()
	priv, pub = filepath.Join(dir, "key.pem"), filepath.Join(dir, "key.pub")
	if err := GenerateKeyPair(kind, priv, pub); err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

func TestBlobSignatureIsCosignCompatible(t *testing.T) {
	privPath, pubPath := keyPair(t, P256)
	priv, err := LoadPrivateKey(privPath)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := LoadPublicKey(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"schema":1}`)
	// cosign sign-blob writes base64(ASN.1 ECDSA over SHA-256 of the bytes).
	digest := sha256.Sum256(data)
	asn1Sig, err := ecdsa.SignASN1(nil, priv.(*ecdsa.PrivateKey), digest[:])
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyBlob(pub, data, base64.StdEncoding.EncodeToString(asn1Sig)+"\n"); err != nil {
		t.Fatalf("cosign-format signature: %v", err)
	}
	ours, err := SignBlob(priv, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyBlob(pub, data, ours); err != nil {
		t.Fatal(err)
	}
	if err := VerifyBlob(pub, []byte(`{"schema":2}`), ours); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered data: got %v", err)
	}
}

func TestEnvelopeRoundTripAndRefusals(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	_, otherPub := keyPair(t, Ed25519)
	priv, _ := LoadPrivateKey(privPath)
	pub, _ := LoadPublicKey(pubPath)
	other, _ := LoadPublicKey(otherPub)
	env, err := SignEnvelope(priv, "application/x-test", []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenEnvelope(pub, env, "application/x-test")
	if err != nil || string(got) != "hello" {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := OpenEnvelope(other, env, "application/x-test"); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("other key: %v", err)
	}
	if _, err := OpenEnvelope(pub, env, "application/x-other"); err == nil {
		t.Fatal("wrong payload type accepted")
	}
	env.Payload = base64.StdEncoding.EncodeToString([]byte("hellO"))
	if _, err := OpenEnvelope(pub, env, "application/x-test"); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("tampered payload: %v", err)
	}
}

func TestGenerateRefusesToOverwriteAndSetsModes(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	if err := GenerateKeyPair(Ed25519, privPath, pubPath); err == nil {
		t.Fatal("overwrote an existing key")
	}
	for path, want := range map[string]os.FileMode{privPath: 0o600, pubPath: 0o644} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v, want %v (%v)", path, fi.Mode().Perm(), want, err)
		}
	}
}
