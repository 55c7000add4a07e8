package workertest

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
	"github.com/steward-dev/steward/workers"
)

// Test document keys. A real instance signs what it stores with its own
// document key and believes only the writer each key expects
// (docs/design.md §7). In tests every identity's key is derived from its
// name, so a runtime restarted in a test verifies what it stored before,
// and an operator's tools in the same test verify it too. A test that
// plays an attacker signs with another identity's name, or with a key of
// its own (proof.NewSigner), and is not believed.

// DocumentKey is the test document key of the writer by ("operator", or
// "<worker>-<instance>").
func DocumentKey(by string) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("steward workertest document key\x00" + by))
	return ed25519.NewKeyFromSeed(seed[:])
}

// Verifier believes every identity's test key.
func Verifier() *proof.Verifier {
	v := proof.NewVerifier()
	v.Derive(func(by string) ed25519.PublicKey { return DocumentKey(by).Public().(ed25519.PublicKey) })
	return v
}

// Signer signs as by with its test key.
func Signer(by string) *proof.Signer { return proof.NewSigner(DocumentKey(by), by, "") }

// DocumentKeys is the runtime option that gives an instance of worker its
// test document keys (Start adds it unless the test gives its own).
func DocumentKeys(worker, instance string) workers.Option {
	by := worker + "-" + instance
	return workers.WithDocumentKeys(Signer(by), Verifier())
}

// OperatorDocs opens the checkpoint bucket as an operator's tools do, with
// the operator's test key: for ops calls (pauses, status) in tests.
func OperatorDocs(t testing.TB, js jetstream.JetStream) *events.Store {
	t.Helper()
	s, err := events.OpenStore(context.Background(), js, events.StoreOptions{Signer: Signer(events.OperatorWriter), Verifier: Verifier()})
	if err != nil {
		t.Fatalf("open the checkpoint bucket as the operator: %v", err)
	}
	return s
}
