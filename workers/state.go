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

// ErrConflict says a compare-and-swap write lost: another process wrote the
// same entry first. Read again and decide again.
var ErrConflict = errors.New("written meanwhile by another process")

// casPut writes only over revision rev (0: only if absent).
func casPut(ctx context.Context, kv jetstream.KeyValue, key string, value []byte, rev uint64) (uint64, error) {
	var (
		next uint64
		err  error
	)
	if rev == 0 {
		next, err = kv.Create(ctx, key, value)
	} else {
		next, err = kv.Update(ctx, key, value, rev)
	}
	// A lost race is 10071 on a single server and 10164 on a replicated
	// bucket; nats.go maps both to these two errors.
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("%s: %w", key, ErrConflict)
	}
	return next, err
}

// State is a worker instance's durable state: small JSON documents by
// name, written with compare-and-swap so two processes never overwrite
// each other blindly. The runtime's lives in the checkpoint bucket;
// NewMemoryState's lives in memory, with the same revisions and conflicts,
// for running a handler in a test.
type State struct {
	kv     jetstream.KeyValue
	prefix string
	// js finds the bucket on first use when kv is not set: a runtime's
	// State exists before Run has ensured the bucket.
	js     jetstream.JetStream
	bindMu sync.Mutex
	// mem, when set, holds the documents instead of kv.
	mem *memStore
}

// NewMemoryState returns an empty State kept in memory. It behaves as the
// runtime's does: Get of a missing document is revision 0, every Put moves
// a revision shared by all documents (as a KV bucket's does), and a Put
// over a revision that is no longer current, or with 0 over a document
// that exists, fails with ErrConflict.
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
		kv, err := s.bucket(ctx)
		if err != nil {
			return 0, err
		}
		entry, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read state %s: %w", name, err)
		}
		raw, rev = entry.Value(), entry.Revision()
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
// returns an error wrapping ErrConflict.
func (s *State) Put(ctx context.Context, name string, v any, rev uint64) (uint64, error) {
	k, err := s.key(name)
	if err != nil {
		return 0, err
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("state %s: %w", name, err)
	}
	var next uint64
	if s.mem != nil {
		next, err = s.mem.put(k, raw, rev)
	} else {
		var kv jetstream.KeyValue
		if kv, err = s.bucket(ctx); err != nil {
			return 0, err
		}
		next, err = casPut(ctx, kv, k, raw, rev)
	}
	if err != nil {
		return 0, fmt.Errorf("write state %s: %w", name, err)
	}
	return next, nil
}

// Documents returns every document of the instance's state by name, as
// stored (JSON), so a test can say what a handler wrote.
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
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeysFiltered(ctx, s.prefix+">")
	if err != nil {
		return nil, fmt.Errorf("list state: %w", err)
	}
	defer keys.Stop()
	for k := range keys.Keys() {
		entry, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("read state %s: %w", k, err)
		}
		out[strings.TrimPrefix(k, s.prefix)] = entry.Value()
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

// put is casPut's rule in memory: over revision rev, or only if absent
// when rev is 0.
func (m *memStore) put(key string, value []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.docs[key]; cur.rev != rev {
		return 0, fmt.Errorf("%s: %w", key, ErrConflict)
	}
	m.rev++
	m.docs[key] = memDoc{value: append([]byte(nil), value...), rev: m.rev}
	return m.rev, nil
}

func isNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }

// bucket is the KV bucket the documents are in, found on first use.
func (s *State) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	s.bindMu.Lock()
	defer s.bindMu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	if s.js == nil {
		return nil, fmt.Errorf("state %s has no bucket", strings.TrimSuffix(s.prefix, "."))
	}
	kv, err := s.js.KeyValue(ctx, CheckpointBucket)
	if err != nil {
		return nil, fmt.Errorf("the checkpoint bucket %s: %w (a worker creates it when it runs; steward setup creates it for all)", CheckpointBucket, err)
	}
	s.kv = kv
	return kv, nil
}
