package signing

import (
	"crypto/ed25519"
	"testing"
)

// TestKeySetKeysAreACopy: Keys lists the set's keys in the order given,
// and changing what it returns does not change the set.
func TestKeySetKeysAreACopy(t *testing.T) {
	_, aPub := keyPair(t, Ed25519)
	_, bPub := keyPair(t, P256)
	ks, err := LoadPublicKeys(aPub + "," + bPub)
	if err != nil {
		t.Fatal(err)
	}
	keys := ks.Keys()
	if len(keys) != 2 {
		t.Fatalf("%d keys, want 2", len(keys))
	}
	if _, ok := keys[0].(ed25519.PublicKey); !ok {
		t.Fatalf("the first key is a %T, want the ed25519 key given first", keys[0])
	}
	keys[0] = nil
	if ks.Keys()[0] == nil || ks.Len() != 2 {
		t.Fatal("changing the slice Keys returned changed the set")
	}
}
