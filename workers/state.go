package workers

import (
	"context"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// checkpoint is what the runtime keeps per worker instance and order key:
// the last stream sequence applied, and the stage a handler saved for the
// event it is working on.
type checkpoint struct {
	Applied  uint64          `json:"applied"`
	EventID  string          `json:"eventId,omitempty"`
	StageSeq uint64          `json:"stageSeq,omitempty"`
	Stage    json.RawMessage `json:"stage,omitempty"`
}

// ErrConflict says a compare-and-swap write lost: another process wrote the
// same entry first. Read again and decide again.
var ErrConflict = errors.New("written meanwhile by another process")

// kvToken turns a key into something a KV key may hold. Subject tokens pass
// as they are; anything else (a version with '+') is base32-encoded behind a
// prefix no token starts with.
func kvToken(key string) string {
	if events.CheckKey(key) == nil {
		return key
	}
	return "_" + strings.ToLower(base32.HexEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(key)))
}

// laneOf names what orders and checkpoints an event: its kind and its
// order key, so a box and a deployment that share a name never share a
// checkpoint.
func laneOf(typ, key string) string {
	kind := strings.ReplaceAll(strings.TrimSuffix(strings.TrimPrefix(typ, "dev.steward."), ".v1"), ".", "-")
	return kvToken(kind) + "." + kvToken(key)
}

func (w *Worker) checkpointKey(lane string) string {
	return "cp." + w.spec.Name + "." + w.spec.Instance + "." + lane
}

func (w *Worker) getCheckpoint(ctx context.Context, lane string) (checkpoint, uint64, error) {
	var cp checkpoint
	entry, err := w.kv.Get(ctx, w.checkpointKey(lane))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return cp, 0, nil
	}
	if err != nil {
		return cp, 0, fmt.Errorf("read checkpoint of %s: %w", lane, err)
	}
	if err := json.Unmarshal(entry.Value(), &cp); err != nil {
		return cp, 0, fmt.Errorf("checkpoint of %s is not readable: %w", lane, err)
	}
	return cp, entry.Revision(), nil
}

func (w *Worker) putCheckpoint(ctx context.Context, lane string, cp checkpoint, rev uint64) (uint64, error) {
	raw, err := json.Marshal(cp)
	if err != nil {
		return 0, err
	}
	return casPut(ctx, w.kv, w.checkpointKey(lane), raw, rev)
}

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
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err) {
		return 0, fmt.Errorf("%s: %w", key, ErrConflict)
	}
	return next, err
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
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
