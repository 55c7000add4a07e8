package proof_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"github.com/steward-dev/steward/internal/proof"
)

// TestAppendProofIsTheProofMarshalled: the proof a signer appends from its
// precomputed parts is, byte for byte, json.Marshal of Sign's Proof, for
// writers and certificates that need escaping too; and Seal appends that
// proof as the document's last member. Readers decode either form, but a
// proof that differed from the struct's marshalling would be a second
// format nobody decided on.
func TestAppendProofIsTheProofMarshalled(t *testing.T) {
	for name, c := range map[string]struct{ by, cert string }{
		"pinned":                  {"credential-hive-1", ""},
		"certified":               {"join-box-7", "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ." + strings.Repeat("x", 600)},
		"characters JSON escapes": {`op<&>"\` + "\u2028", "a<b>&\"c\\\n"},
	} {
		s := proof.NewSigner(key(t), c.by, c.cert)
		for _, n := range []uint64{0, 1, 18446744073709551615} {
			for _, content := range [][]byte{nil, []byte(`{}`), []byte(`{"applied":7,"eventId":"e-7"}`)} {
				want, err := json.Marshal(s.Sign(scope, n, content))
				if err != nil {
					t.Fatal(err)
				}
				if got := s.AppendProof([]byte("prefix"), scope, n, content); !bytes.Equal(got, append([]byte("prefix"), want...)) {
					t.Fatalf("%s, n %d, content %q:\n got %s\nwant prefix%s", name, n, content, got, want)
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
				wantSealed := append(append(append(head, `"proof":`...), want...), '}')
				if !bytes.Equal(sealed, wantSealed) {
					t.Fatalf("%s, n %d: sealed\n %s\nwant\n %s", name, n, sealed, wantSealed)
				}
			}
		}
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
