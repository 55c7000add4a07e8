package main

import (
	"bytes"
	"crypto/ecdsa"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/signing"
	"github.com/steward-dev/steward/workers/converge"
)

// The release key `steward keys` writes is in cosign's own encrypted
// format (cosign refuses a plain PKCS#8 block with "unsupported pem type:
// PRIVATE KEY"), sealed with COSIGN_PASSWORD, and is the key of the .pub
// beside it. converge's testdata/cosign3 holds a key written this way and
// the bundle the real cosign v3.1.3 CLI signed with it.
func TestKeysWritesCosignReleaseKey(t *testing.T) {
	env := []string{"COSIGN_PASSWORD=pw-for-test"}
	dir := filepath.Join(t.TempDir(), "keys")
	r := ok(t, env, "keys", "--dir", dir, "--kind", "ecdsa-p256")
	if !strings.Contains(r.stdout, "cosign format, sealed with $COSIGN_PASSWORD") {
		t.Fatalf("keys said %q", r.stdout)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "cosign.key"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(raw, []byte("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n")) {
		t.Fatalf("cosign.key is not cosign's format: %.60s", raw)
	}
	if st, err := os.Stat(filepath.Join(dir, "cosign.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("cosign.key mode %v (%v)", st.Mode(), err)
	}
	priv, err := converge.LoadReleaseSigner(filepath.Join(dir, "cosign.key"), []byte("pw-for-test"))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := signing.LoadPublicKey(filepath.Join(dir, "cosign.pub"))
	if err != nil {
		t.Fatal(err)
	}
	if !priv.Public().(*ecdsa.PublicKey).Equal(pub) {
		t.Fatal("cosign.key and cosign.pub are not one pair")
	}
	if _, err := converge.LoadReleaseSigner(filepath.Join(dir, "cosign.key"), nil); err == nil {
		t.Fatal("the key opened without its password")
	}
	// Never overwritten.
	if again := run(t, env, "keys", "--dir", dir, "--kind", "ecdsa-p256"); again.code == 0 {
		t.Fatal("a second run replaced the key")
	}
}
