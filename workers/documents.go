package workers

import (
	"context"
	"crypto/ed25519"
	"maps"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/proof"
)

// Stored documents prove their writer (docs/design.md §7): the instance
// signs its checkpoints, stages, state, cursor and status with its
// document key, and believes a document of its own keys only when it
// verifies as its own (a pause: as the operator's). Everything the runtime
// reads or writes in the bucket goes through events.Store, which reports
// each document that does not verify here.

// maxForgeries is how many forged documents an instance's status keeps
// (the newest): enough to name who is forging, bounded against a flood.
const maxForgeries = 16

// forgeries is what the instance found forged since it started.
type forgeries struct {
	mu     sync.Mutex
	counts map[events.DocKind]uint64
	latest []events.Forgery
}

func (f *forgeries) add(x events.Forgery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.counts == nil {
		f.counts = map[events.DocKind]uint64{}
	}
	f.counts[x.Kind]++
	f.latest = append(f.latest, x)
	if len(f.latest) > maxForgeries {
		f.latest = f.latest[len(f.latest)-maxForgeries:]
	}
}

func (f *forgeries) snapshot() (map[events.DocKind]uint64, []events.Forgery) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.counts) == 0 {
		return nil, nil
	}
	return maps.Clone(f.counts), append([]events.Forgery(nil), f.latest...)
}

// documentKeys fills in the document keys when none were given: a key
// that lives only in this process, so the instance still never believes
// what another identity wrote; what it stored before a restart is then
// decided again (handlers are idempotent).
func documentKeys(o *options, by string) (ephemeral bool) {
	if o.signer != nil {
		if o.verifier == nil {
			o.verifier = proof.NewVerifier()
			o.verifier.Pin(o.signer.By(), o.signer.Public())
		}
		return false
	}
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic("workers: no randomness for a document key: " + err.Error())
	}
	o.signer = proof.NewSigner(priv, by, "")
	if o.verifier == nil {
		o.verifier = proof.NewVerifier()
	}
	o.verifier.Pin(by, o.signer.Public())
	return true
}

// newStore reads and writes kv as this instance.
func (w *Runtime) newStore(ctx context.Context, kv jetstream.KeyValue) (*events.Store, error) {
	s := events.NewStore(kv, events.StoreOptions{
		Signer: w.o.signer, Verifier: w.o.verifier, Domain: w.o.domain, Now: w.o.now,
		OnForged: w.noteForgery,
	})
	// The upgrade record is read at the first unsigned document, not here:
	// a fleet starting at once sends the server nothing for it.
	s.BindStream(ctx, w.js)
	return s, nil
}

// noteForgery logs, counts and keeps a document that did not verify.
func (w *Runtime) noteForgery(f events.Forgery) {
	w.forged.add(f)
	if c, ok := w.m.forged[f.Kind]; ok {
		c.Inc()
	}
	w.log.Warn().Str("key", f.Key).Str("kind", string(f.Kind)).Uint64("revision", f.Revision).
		Str("reflected_from", f.ReflectedFrom).Str("reason", f.Reason).
		Msg("a document in the checkpoint bucket does not verify as this instance's, so it is not believed (docs/design.md §7: find the identity that wrote it and revoke its credentials)")
}
