package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// State is a worker instance's durable state: small JSON documents by
// name, written with compare-and-swap so two processes never overwrite
// each other blindly. The runtime's lives in the checkpoint bucket;
// NewMemoryState's lives in memory, with the same revisions and conflicts,
// for running a handler in a test.
type State struct {
	prefix string
	// open finds the store on first use: a runtime's State exists before
	// Run has ensured the bucket.
	open func(context.Context) (*events.Store, error)
	// mem, when set, holds the documents instead of the bucket.
	mem *memStore
}

// NewMemoryState returns an empty State kept in memory. It behaves as the
// runtime's does: Get of a missing document is revision 0, every Put moves
// a revision shared by all documents (as a KV bucket's does), and a Put
// over a revision that is no longer current, or with 0 over a document
// that exists, fails with events.ErrConflict.
func NewMemoryState() *State { return &State{mem: &memStore{docs: map[string]memDoc{}}} }

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
	var (
		raw []byte
		rev uint64
	)
	if s.mem != nil {
		raw, rev = s.mem.get(k)
	} else {
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
		raw, rev = doc.Value, doc.Revision
	}
	if rev == 0 {
		return 0, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return 0, fmt.Errorf("state %s is not readable: %w", name, err)
	}
	return rev, nil
}

// Put writes v as the document name if its revision is still rev (0: only
// if it does not exist yet) and returns the new revision. A lost race
// returns an error wrapping events.ErrConflict.
func (s *State) Put(ctx context.Context, name string, v any, rev uint64) (uint64, error) {
	k, err := s.key(name)
	if err != nil {
		return 0, err
	}
	var next uint64
	if s.mem != nil {
		raw, merr := json.Marshal(v)
		if merr != nil {
			return 0, fmt.Errorf("state %s: %w", name, merr)
		}
		next, err = s.mem.put(k, raw, rev)
	} else {
		var store *events.Store
		if store, err = s.open(ctx); err != nil {
			return 0, err
		}
		next, err = store.Put(ctx, k, v, rev)
	}
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
	if s.mem != nil {
		s.mem.mu.Lock()
		defer s.mem.mu.Unlock()
		for k, d := range s.mem.docs {
			out[k] = append(json.RawMessage(nil), d.value...)
		}
		return out, nil
	}
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

// memStore is NewMemoryState's store. Its revision counter is shared by all
// documents, as a KV bucket's stream sequence is, so a revision read for one
// document never happens to match another's.
type memStore struct {
	mu   sync.Mutex
	rev  uint64
	docs map[string]memDoc
}

type memDoc struct {
	value []byte
	rev   uint64
}

func (m *memStore) get(key string) ([]byte, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d := m.docs[key]
	return d.value, d.rev
}

// put is the bucket's compare-and-swap rule in memory: over revision rev, or only if absent
// when rev is 0.
func (m *memStore) put(key string, value []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.docs[key]; cur.rev != rev {
		return 0, fmt.Errorf("%s: %w", key, events.ErrConflict)
	}
	m.rev++
	m.docs[key] = memDoc{value: append([]byte(nil), value...), rev: m.rev}
	return m.rev, nil
}

func isNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
