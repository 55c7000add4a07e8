package signing

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/strictjson"
)

func rotationData() events.CredentialRotated {
	return events.CredentialRotated{Hive: "hive-1", Version: 7, ClientID: "client-7", Secret: "-----BEGIN AGE ENCRYPTED FILE-----\nx\n-----END AGE ENCRYPTED FILE-----\n"}
}

// TestRotationBindsEveryField signs a rotation and changes each field in
// turn, the version to 2^64-1 among them: only the untouched one opens.
func TestRotationBindsEveryField(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	priv, _ := LoadPrivateKey(privPath)
	keys, err := LoadEnvelopeKeys(pubPath)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := SignRotation(priv, rotationData())
	if err != nil {
		t.Fatal(err)
	}
	if p, err := OpenRotation(keys, signed); err != nil || p.Version != 7 || p.Hive != "hive-1" {
		t.Fatalf("open: %+v %v", p, err)
	}
	for name, c := range map[string]struct {
		mutate func(*events.CredentialRotated)
		rule   string
	}{
		"no envelope":  {func(d *events.CredentialRotated) { d.Envelope = nil }, RuleUnsigned},
		"huge version": {func(d *events.CredentialRotated) { d.Version = math.MaxUint64 }, RuleBinding},
		"hive":         {func(d *events.CredentialRotated) { d.Hive = "hive-2" }, RuleBinding},
		"client id":    {func(d *events.CredentialRotated) { d.ClientID = "evil" }, RuleBinding},
		"secret":       {func(d *events.CredentialRotated) { d.Secret += "x" }, RuleBinding},
	} {
		d := signed
		c.mutate(&d)
		_, err := OpenRotation(keys, d)
		var se *StateError
		if !errors.As(err, &se) || se.Rule != c.rule {
			t.Errorf("%s: %v, want rule %s", name, err, c.rule)
		}
	}
	if _, err := OpenRotation(keys, signed); err != nil {
		t.Fatal("a mutation changed the signed original")
	}
}

// TestGrantBindsEveryConsumer: a consumer added, dropped or reordered
// under a valid signature is refused.
func TestGrantBindsEveryConsumer(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	priv, _ := LoadPrivateKey(privPath)
	keys, _ := LoadEnvelopeKeys(pubPath)
	g := events.GrantChanged{Machine: "m1", Requirement: "postgres", Generation: 2, Given: []events.Given{
		{From: "a", Node: "a", Values: events.GivenValues{Name: "a"}, Secret: "sa"},
		{From: "b", Node: "b", Values: events.GivenValues{Name: "b"}, Secret: "sb"},
	}}
	signed, err := SignGrant(priv, g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenGrant(keys, signed); err != nil {
		t.Fatal(err)
	}
	swapped := signed
	swapped.Given = []events.Given{signed.Given[1], signed.Given[0]}
	dropped := signed
	dropped.Given = signed.Given[:1]
	huge := signed
	huge.Generation = math.MaxInt64
	for name, d := range map[string]events.GrantChanged{"swapped": swapped, "dropped": dropped, "huge generation": huge} {
		if _, err := OpenGrant(keys, d); !errors.Is(err, ErrNotBound) {
			t.Errorf("%s: %v, want ErrNotBound", name, err)
		}
	}
}

// TestKeySetAcceptsAnyOfItsKeys: a set from a comma list or from one PEM
// file of several blocks verifies with either key and refuses a third.
func TestKeySetAcceptsAnyOfItsKeys(t *testing.T) {
	aPriv, aPub := keyPair(t, Ed25519)
	bPriv, bPub := keyPair(t, Ed25519)
	cPriv, _ := keyPair(t, Ed25519)
	pa, _ := os.ReadFile(aPub)
	pb, _ := os.ReadFile(bPub)
	both := filepath.Join(t.TempDir(), "set.pub")
	os.WriteFile(both, append(append(pa, pb...), pa...), 0o644)
	for _, spec := range []string{aPub + "," + bPub, both, " " + aPub + " , " + bPub + " ,"} {
		ks, err := LoadEnvelopeKeys(spec)
		if err != nil || ks.Len() != 2 {
			t.Fatalf("%s: %v keys, %v", spec, ks, err)
		}
		for name, priv := range map[string]string{"a": aPriv, "b": bPriv, "c": cPriv} {
			k, _ := LoadPrivateKey(priv)
			env, _ := SignEnvelope(k, "application/x-test", []byte("hi"))
			_, id, err := ks.OpenEnvelope(env, "application/x-test")
			if (name == "c") != (err != nil) {
				t.Errorf("%s signed, set %s: %v", name, spec, err)
			}
			if err == nil && id != env.Signatures[0].KeyID {
				t.Errorf("key id %s, envelope names %s", id, env.Signatures[0].KeyID)
			}
		}
	}
	// A private key among the public ones is refused, never quoted.
	_, err := LoadPublicKeys(aPub + "," + aPriv)
	if err == nil || !strings.Contains(err.Error(), "not a PUBLIC KEY") || strings.Contains(err.Error(), "MC4CAQ") {
		t.Fatalf("a private key in the set: %v", err)
	}
	_, p256 := keyPair(t, P256)
	if _, err := LoadEnvelopeKeys(p256); err == nil {
		t.Fatal("an ECDSA key verifies envelopes")
	}
	if ks, err := LoadPublicKeys(p256 + "," + aPub); err != nil || ks.Len() != 2 {
		t.Fatalf("a release key set of both kinds: %v", err)
	}
}

// TestSignEventRefusesWhatItCannotReadStrictly: the signer signs only data
// it reads exactly as a reviewer would.
func TestSignEventRefusesWhatItCannotReadStrictly(t *testing.T) {
	privPath, pubPath := keyPair(t, Ed25519)
	priv, _ := LoadPrivateKey(privPath)
	keys, _ := LoadEnvelopeKeys(pubPath)
	e, err := events.New(events.TypeCredentialRotated, "hive-1", rotationData())
	if err != nil {
		t.Fatal(err)
	}
	s, err := SignEvent(priv, e)
	if err != nil {
		t.Fatal(err)
	}
	var d events.CredentialRotated
	if err := s.DataAs(&d); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenRotation(keys, d); err != nil {
		t.Fatalf("a signed event does not open: %v", err)
	}
	if strings.Contains(string(mustJSON(t, s)), "data_base64") {
		t.Fatal("the signed event's data is written as base64")
	}
	dup, _ := events.New(events.TypeCredentialRotated, "hive-1", []byte(`{"hive":"hive-1","version":1,"Version":9,"clientId":"c","secret":"s"}`))
	if _, err := SignEvent(priv, dup); !errors.Is(err, errNotStrictProbe()) {
		t.Fatalf("a miscased duplicate field was signed: %v", err)
	}
}

func mustJSON(t *testing.T, v interface{ MarshalJSON() ([]byte, error) }) []byte {
	t.Helper()
	b, err := v.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func errNotStrictProbe() error { return strictjson.ErrNotStrict }
