package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// State is a worker instance's durable state in the checkpoint bucket:
// small JSON documents by name, written with compare-and-swap so two
// processes never overwrite each other blindly.
type State struct {
	kv     jetstream.KeyValue
	prefix string
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
	entry, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read state %s: %w", name, err)
	}
	if err := json.Unmarshal(entry.Value(), v); err != nil {
		return 0, fmt.Errorf("state %s is not readable: %w", name, err)
	}
	return entry.Revision(), nil
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
	next, err := casPut(ctx, s.kv, k, raw, rev)
	if err != nil {
		return 0, fmt.Errorf("write state %s: %w", name, err)
	}
	return next, nil
}

func isNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
