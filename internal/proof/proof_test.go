package proof_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"path/filepath"
	"testing"

	"github.com/steward-dev/steward/internal/natsauth"
	"github.com/steward-dev/steward/internal/proof"
)

func key(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

var scope = proof.Scope{Bucket: "STEWARD_CHECKPOINTS", Key: "cp.join.box-7.invitation-written.box-7"}

// TestSealedDocumentsOpenOnlyWhereTheyWereWritten: a document verifies for
// its own key, bucket, domain and writer, and for nothing else; its
// content is exactly what was signed.
func TestSealedDocumentsOpenOnlyWhereTheyWereWritten(t *testing.T) {
	priv := key(t)
	s := proof.NewSigner(priv, "join-box-7", "")
	v := proof.NewVerifier()
	v.Pin("join-box-7", priv.Public().(ed25519.PublicKey))
	content := []byte(`{"applied":7,"eventId":"e-7"}`)
	sealed, err := s.Seal(scope, 3, content)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.Open(scope, sealed, "join-box-7")
	if err != nil || !bytes.Equal(got.Content, content) || got.N != 3 || got.By != "join-box-7" {
		t.Fatalf("opened %+v (%v)", got, err)
	}
	empty, err := s.Seal(scope, 1, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := v.Open(scope, empty, "join-box-7"); err != nil || string(got.Content) != "{}" {
		t.Fatalf("an empty document opened as %q (%v)", got.Content, err)
	}

	for name, c := range map[string]struct {
		scope   proof.Scope
		raw     []byte
		writers []string
	}{
		"another key":             {proof.Scope{Bucket: scope.Bucket, Key: "cp.provision.db-1.grant-changed.db-1"}, sealed, []string{"join-box-7"}},
		"another bucket":          {proof.Scope{Bucket: "OTHER", Key: scope.Key}, sealed, []string{"join-box-7"}},
		"another domain":          {proof.Scope{Bucket: scope.Bucket, Domain: "site-a", Key: scope.Key}, sealed, []string{"join-box-7"}},
		"another writer":          {scope, sealed, []string{"provision-db-1"}},
		"content changed":         {scope, bytes.Replace(sealed, []byte(`"applied":7`), []byte(`"applied":9`), 1), []string{"join-box-7"}},
		"counter changed":         {scope, bytes.Replace(sealed, []byte(`"n":3`), []byte(`"n":9`), 1), []string{"join-box-7"}},
		"a field after the proof": {scope, append(bytes.TrimSuffix(sealed, []byte("}")), []byte(`,"applied":9}`)...), []string{"join-box-7"}},
	} {
		if _, err := v.Open(c.scope, c.raw, c.writers...); !errors.Is(err, proof.ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		}
	}
	if _, err := v.Open(scope, content, "join-box-7"); !errors.Is(err, proof.ErrUnsigned) {
		t.Errorf("an unsigned document: %v, want ErrUnsigned", err)
	}
	// The same writer's name with a key nobody pinned or certified.
	other := proof.NewSigner(key(t), "join-box-7", "")
	forged, _ := other.Seal(scope, 4, content)
	if _, err := v.Open(scope, forged, "join-box-7"); !errors.Is(err, proof.ErrForged) {
		t.Errorf("a key that is not the writer's: %v, want ErrForged", err)
	}
}

// TestCertifiedKeys: a key certified by a user JWT of the trusted account
// is believed for the identity the JWT names, and for no other; a JWT of
// another account certifies nothing.
func TestCertifiedKeys(t *testing.T) {
	dir := t.TempDir()
	a, err := natsauth.LoadOrCreate(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	box, _ := natsauth.Worker("join", "box-7")
	creds := filepath.Join(dir, "join-box-7.creds")
	if err := a.WriteCreds(creds, box); err != nil {
		t.Fatal(err)
	}
	s, err := proof.LoadSigner(proof.KeyFileFor(creds), creds, "join-box-7")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proof.LoadSigner(proof.KeyFileFor(creds), creds, "provision-db-1"); err == nil {
		t.Fatal("a signer claiming another identity than its credentials was loaded")
	}
	v := proof.NewVerifier()
	if err := v.TrustIssuerOf(creds); err != nil {
		t.Fatal(err)
	}
	sealed, err := s.Seal(scope, 1, []byte(`{"applied":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Open(scope, sealed, "join-box-7"); err != nil {
		t.Fatalf("a certified key: %v", err)
	}
	if _, err := v.Open(scope, sealed, "provision-db-1"); !errors.Is(err, proof.ErrForged) {
		t.Fatalf("the box's key for another writer: %v", err)
	}
	// Another authority's account: its JWTs certify nothing here.
	b, err := natsauth.LoadOrCreate(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.creds")
	if err := b.WriteCreds(foreign, box); err != nil {
		t.Fatal(err)
	}
	fs, err := proof.LoadSigner(proof.KeyFileFor(foreign), foreign, "join-box-7")
	if err != nil {
		t.Fatal(err)
	}
	fsealed, _ := fs.Seal(scope, 1, []byte(`{"applied":1}`))
	if _, err := v.Open(scope, fsealed, "join-box-7"); !errors.Is(err, proof.ErrForged) {
		t.Fatalf("a key certified by another account: %v", err)
	}
	if hex.EncodeToString(s.Public()) == hex.EncodeToString(fs.Public()) {
		t.Fatal("two identities share a document key")
	}
}
