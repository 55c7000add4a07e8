package proof_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/proof"
)

// TestAppendProofIsTheProofMarshalled: the proof a signer appends from the
// parts it marshalled once decodes to the Proof it means (format, writer,
// key, counter, certificate) with a signature that verifies, and is, byte
// for byte, what json.Marshal makes of that Proof, for writers and
// certificates that need escaping too: a proof that differed from the
// struct's marshalling would be a second format nobody decided on. Seal
// appends it as the document's last member.
func TestAppendProofIsTheProofMarshalled(t *testing.T) {
	for name, c := range map[string]struct{ by, cert string }{
		"pinned":                  {"credential-hive-1", ""},
		"certified":               {"join-box-7", "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ." + strings.Repeat("x", 600)},
		"characters JSON escapes": {`op<&>"\` + "\u2028", "a<b>&\"c\\\n"},
	} {
		priv := key(t)
		s := proof.NewSigner(priv, c.by, c.cert)
		v := proof.NewVerifier()
		v.Pin(c.by, priv.Public().(ed25519.PublicKey))
		for _, n := range []uint64{0, 1, 18446744073709551615} {
			for _, content := range [][]byte{nil, []byte(`{}`), []byte(`{"applied":7,"eventId":"e-7"}`)} {
				raw := s.AppendProof([]byte("prefix"), scope, n, content)
				p, ok := bytes.CutPrefix(raw, []byte("prefix"))
				if !ok {
					t.Fatalf("%s: what dst held was not kept: %s", name, raw)
				}
				var got proof.Proof
				if err := json.Unmarshal(p, &got); err != nil {
					t.Fatalf("%s, n %d: %s does not decode: %v", name, n, p, err)
				}
				if got.V != 1 || got.By != c.by || got.Key != hex.EncodeToString(priv.Public().(ed25519.PublicKey)) || got.N != n || got.Cert != c.cert {
					t.Fatalf("%s, n %d: decoded %+v", name, n, got)
				}
				if err := v.Verify(scope, got, content, c.by); err != nil {
					t.Fatalf("%s, n %d: %v", name, n, err)
				}
				if want, err := json.Marshal(got); err != nil || !bytes.Equal(p, want) {
					t.Fatalf("%s, n %d:\n got %s\nwant %s (%v)", name, n, p, want, err)
				}
				if got, want := s.ProofLen(n), len(p); got != want {
					t.Fatalf("%s, n %d: ProofLen says %d, the proof is %d long", name, n, got, want)
				}
				if len(content) == 0 {
					continue
				}
				sealed, err := s.Seal(scope, n, content)
				if err != nil {
					t.Fatal(err)
				}
				head := bytes.TrimSuffix(content, []byte("}"))
				if len(content) > 2 {
					head = append(head, ',')
				}
				if want := append(append(append(head, `"proof":`...), p...), '}'); !bytes.Equal(sealed, want) {
					t.Fatalf("%s, n %d: sealed\n %s\nwant\n %s", name, n, sealed, want)
				}
			}
		}
	}
}

// TestASealedDocumentIsItsCallersAlone: a caller that appends to a copy
// of a sealed document (a test forging a field after the proof, say)
// does not change the document: Seal leaves no spare room to write into.
func TestASealedDocumentIsItsCallersAlone(t *testing.T) {
	priv := key(t)
	s := proof.NewSigner(priv, "join-box-7", "")
	v := proof.NewVerifier()
	v.Pin("join-box-7", priv.Public().(ed25519.PublicKey))
	sealed, err := s.Seal(scope, 3, []byte(`{"applied":7,"eventId":"e-7"}`))
	if err != nil {
		t.Fatal(err)
	}
	kept := bytes.Clone(sealed)
	forged := append(bytes.TrimSuffix(sealed, []byte("}")), `,"applied":9}`...)
	if _, err := v.Open(scope, forged, "join-box-7"); err == nil {
		t.Fatal("a field after the proof opened")
	}
	if !bytes.Equal(sealed, kept) {
		t.Fatalf("appending to a copy changed the sealed document:\n%s\nwas\n%s", sealed, kept)
	}
	if _, err := v.Open(scope, sealed, "join-box-7"); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkSeal is what signing a checkpoint costs a worker on every event
// it settles: its content is about a checkpoint's size.
func BenchmarkSeal(b *testing.B) {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		b.Fatal(err)
	}
	s := proof.NewSigner(priv, "credential-hive-1", "")
	content := []byte(`{"applied":123456,"eventId":"01JDQ8Z4J8X9Q2V7K3M5N6P7R8"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Seal(scope, 42, content); err != nil {
			b.Fatal(err)
		}
	}
}
