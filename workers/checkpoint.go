package workers

import (
	"context"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// checkpoint is what the runtime keeps per worker instance and order key:
// the last stream sequence settled (applied, refused, superseded or
// dead-lettered), and the stage a handler saved for the event it is
// working on. Its JSON is the stored format, read by every version since
// the first: add fields, never rename them.
type checkpoint struct {
	Applied  uint64          `json:"applied"`
	EventID  string          `json:"eventId,omitempty"`
	StageSeq uint64          `json:"stageSeq,omitempty"`
	Stage    json.RawMessage `json:"stage,omitempty"`
}

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

// CheckpointKey is the key in CheckpointBucket under which an instance of
// a worker keeps its checkpoint for the events of type typ and order key
// key: cp.<worker>.<instance>.<kind>.<key>, the kind being the type
// without dev.steward. and .v1, dots as dashes, and a kind or key that is
// not a subject token base32-encoded behind '_'. instance may be "*" in a
// watch filter over every instance.
func CheckpointKey(worker, instance, typ, key string) string {
	return checkpointKey(worker, instance, laneOf(typ, key))
}

func checkpointKey(worker, instance, lane string) string {
	return "cp." + worker + "." + instance + "." + lane
}

func (w *Runtime) checkpointKey(lane string) string {
	return checkpointKey(w.spec.Name, w.spec.Instance, lane)
}

// checkpointFor returns the checkpoint of h's lane and its revision, from
// the cache when this process wrote or read it last and has seen every
// delivery since (cached is then true), else from the bucket.
func (w *Runtime) checkpointFor(ctx context.Context, h *held) (cp checkpoint, rev uint64, cached bool, err error) {
	if c, ok := w.cps.get(h.lane); ok && c.epoch == w.epoch.Load() {
		return c.cp, c.rev, true, nil
	}
	cp, rev, err = w.getCheckpoint(ctx, h.lane)
	return cp, rev, false, err
}

func (w *Runtime) getCheckpoint(ctx context.Context, lane string) (checkpoint, uint64, error) {
	var cp checkpoint
	epoch := w.epoch.Load()
	entry, err := w.kv.Get(ctx, w.checkpointKey(lane))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		w.cps.put(lane, cachedCP{epoch: epoch})
		return cp, 0, nil
	}
	if err != nil {
		return cp, 0, fmt.Errorf("read checkpoint of %s: %w", lane, err)
	}
	if err := json.Unmarshal(entry.Value(), &cp); err != nil {
		return cp, 0, fmt.Errorf("checkpoint of %s is not readable: %w", lane, err)
	}
	w.cps.put(lane, cachedCP{cp: cp, rev: entry.Revision(), epoch: epoch})
	return cp, entry.Revision(), nil
}

func (w *Runtime) putCheckpoint(ctx context.Context, lane string, cp checkpoint, rev uint64) (uint64, error) {
	raw, err := json.Marshal(cp)
	if err != nil {
		return 0, err
	}
	// The epoch is read before the write: a gap seen meanwhile leaves the
	// cached entry stale, and the next event of the lane reads again.
	epoch := w.epoch.Load()
	next, err := casPut(ctx, w.kv, w.checkpointKey(lane), raw, rev)
	if err != nil {
		w.cps.drop(lane)
		return 0, err
	}
	w.cps.put(lane, cachedCP{cp: cp, rev: next, epoch: epoch})
	return next, nil
}

// markApplied moves the key's checkpoint to this event (applied, refused,
// superseded or dead-lettered), unless another process already moved it
// further, so later events of the key never wait for it. cp and rev are
// what the caller last read or wrote.
func (w *Runtime) markApplied(ctx context.Context, h *held, cp checkpoint, rev uint64) error {
	for range 5 {
		if cp.Applied >= h.seq {
			return nil
		}
		next := checkpoint{Applied: h.seq, EventID: h.event.ID()}
		_, err := w.putCheckpoint(ctx, h.lane, next, rev)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrConflict) {
			return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), err)
		}
		if cp, rev, err = w.getCheckpoint(ctx, h.lane); err != nil {
			return err
		}
	}
	return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), ErrConflict)
}

// cpCacheSize bounds the checkpoints cached per worker instance: enough for
// every key of a busy instance, small enough to ignore for a fleet host.
const cpCacheSize = 4096

// cachedCP is a checkpoint as this process last read or wrote it, valid
// while the worker's delivery epoch is unchanged.
type cachedCP struct {
	cp    checkpoint
	rev   uint64
	epoch uint64
}

// cpCache is a bounded map of cached checkpoints; when full, an arbitrary
// entry goes (it is only read again from the bucket).
type cpCache struct {
	mu      sync.Mutex
	entries map[string]cachedCP
	limit   int
}

func newCPCache(limit int) cpCache {
	return cpCache{entries: map[string]cachedCP{}, limit: limit}
}

func (c *cpCache) get(lane string) (cachedCP, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[lane]
	return e, ok
}

func (c *cpCache) put(lane string, e cachedCP) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[lane]; !ok && len(c.entries) >= c.limit {
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	c.entries[lane] = e
}

func (c *cpCache) drop(lane string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, lane)
}
