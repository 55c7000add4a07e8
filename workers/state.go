package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// State is a worker instance's durable state: small JSON documents by
// name in the checkpoint bucket, signed by the instance (docs/design.md
// §7), written with compare-and-swap so two processes never overwrite each
// other blindly. Under workertest the bucket is in memory, with the same
// revisions, conflicts and signatures.
type State struct {
	prefix string
	// open finds the store on first use: a runtime's State exists before
	// Run has ensured the bucket.
	open func(context.Context) (*events.Store, error)
}

func (s *State) key(name string) (string, error) {
	if err := events.CheckKey(name); err != nil {
		return "", fmt.Errorf("state name: %w", err)
	}
	return s.prefix + name, nil
}

// Get decodes the document name into v and returns its revision. A missing
// document returns revision 0 and leaves v alone.
func (s *State) Get(ctx context.Context, name string, v any) (uint64, error) {
	k, err := s.key(name)
	if err != nil {
		return 0, err
	}
	store, err := s.open(ctx)
	if err != nil {
		return 0, err
	}
	doc, err := store.Get(ctx, k)
	if err != nil {
		return 0, fmt.Errorf("read state %s: %w", name, err)
	}
	if doc.Present() && !doc.Trusted {
		return doc.Revision, fmt.Errorf("state %s (%s): %w: %s", name, k, ErrUntrusted, doc.Forgery.Reason)
	}
	if doc.Revision == 0 {
		return 0, nil
	}
	if err := json.Unmarshal(doc.Value, v); err != nil {
		return 0, fmt.Errorf("state %s is not readable: %w", name, err)
	}
	return doc.Revision, nil
}

// Put writes v as the document name if its revision is still rev (0: only
// if it does not exist yet) and returns the new revision. A lost race
// returns an error wrapping events.ErrConflict.
func (s *State) Put(ctx context.Context, name string, v any, rev uint64) (uint64, error) {
	k, err := s.key(name)
	if err != nil {
		return 0, err
	}
	store, err := s.open(ctx)
	if err != nil {
		return 0, err
	}
	next, err := store.Put(ctx, k, v, rev)
	if err != nil {
		return 0, fmt.Errorf("write state %s: %w", name, err)
	}
	return next, nil
}

// Documents returns every document of the instance's state by name, as
// signed (JSON, without its proof), so a test can say what a handler
// wrote. A document that does not verify is returned as nil.
func (s *State) Documents(ctx context.Context) (map[string]json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	store, err := s.open(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := store.KV().ListKeysFiltered(ctx, s.prefix+">")
	if err != nil {
		return nil, fmt.Errorf("list state: %w", err)
	}
	defer keys.Stop()
	for k := range keys.Keys() {
		doc, err := store.Get(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("read state %s: %w", k, err)
		}
		if !doc.Present() {
			continue // deleted meanwhile
		}
		out[strings.TrimPrefix(k, s.prefix)] = doc.Value
	}
	return out, nil
}

func isNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
