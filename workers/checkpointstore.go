package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/steward-dev/steward/events"
)

// checkpoint is the document the runtime keeps per instance and lane
// (events.Checkpoint, stored under events.LaneCheckpointKey).
type checkpoint = events.Checkpoint

// laneOf names what orders and checkpoints an event (events.Lane).
func laneOf(typ, key string) string { return events.Lane(typ, key) }

// checkpointStore keeps the instance's checkpoints, one per lane, in the
// checkpoint bucket through the instance's events.Store, which signs what
// it writes and verifies what it reads. It caches each lane's checkpoint as
// this process last read or wrote it, valid while the delivery epoch is
// unchanged: an event that follows another of its key costs no read, and a
// gap in the deliveries (another process took some) makes every cached one
// stale at once.
type checkpointStore struct {
	name, instance string
	// docs is the instance's store, bound at Ensure (Runtime.bindStore).
	docs  *events.Store
	cache cpCache
	// epoch counts the gaps seen in the consumer's deliveries.
	epoch atomic.Uint64
}

func newCheckpointStore(name, instance string) *checkpointStore {
	return &checkpointStore{name: name, instance: instance, cache: newCPCache(cpCacheSize)}
}

func (c *checkpointStore) key(lane string) string {
	return events.LaneCheckpointKey(c.name, c.instance, lane)
}

// gap notes that deliveries went elsewhere: every cached checkpoint may be
// stale, and is read again before it is used.
func (c *checkpointStore) gap() { c.epoch.Add(1) }

// forLane returns the checkpoint of h's lane and its revision, from the
// cache when this process wrote or read it last and has seen every
// delivery since (cached is then true), else from the bucket.
func (c *checkpointStore) forLane(ctx context.Context, h *held) (cp checkpoint, rev uint64, cached bool, err error) {
	if e, ok := c.cache.get(h.lane); ok && e.epoch == c.epoch.Load() {
		return e.cp, e.rev, true, nil
	}
	cp, rev, _, err = c.read(ctx, h.lane)
	return cp, rev, false, err
}

// read reads the lane's checkpoint with its revision and whether it
// verified. One that is there but does not verify as this instance's counts
// as absent (cp is empty: its events are decided again, and the stage it
// names is discarded), but its revision is returned, so the next write
// replaces it.
func (c *checkpointStore) read(ctx context.Context, lane string) (cp checkpoint, rev uint64, verified bool, err error) {
	epoch := c.epoch.Load()
	doc, err := c.docs.Get(ctx, c.key(lane))
	if err != nil {
		return cp, 0, false, fmt.Errorf("read checkpoint of %s: %w", lane, err)
	}
	if err := doc.Decode(&cp); err != nil {
		return cp, 0, false, err
	}
	verified = !doc.Present() || doc.Trusted
	c.cache.put(lane, cachedCP{cp: cp, rev: doc.Revision, epoch: epoch, untrusted: !verified})
	return cp, doc.Revision, verified, nil
}

// write replaces the lane's checkpoint at revision rev with cp and returns
// the new revision; an error wrapping events.ErrConflict says another
// process wrote it meanwhile.
func (c *checkpointStore) write(ctx context.Context, lane string, cp checkpoint, rev uint64) (uint64, error) {
	// The epoch is read before the write: a gap seen meanwhile leaves the
	// cached entry stale, and the next event of the lane reads again.
	epoch := c.epoch.Load()
	next, err := c.docs.Put(ctx, c.key(lane), cp, rev)
	if err != nil {
		c.cache.drop(lane)
		return 0, err
	}
	c.cache.put(lane, cachedCP{cp: cp, rev: next, epoch: epoch})
	return next, nil
}

// settle moves the key's checkpoint to h (applied, refused, superseded or
// dead-lettered), unless another process already moved it further, so
// later events of the key never wait for it. cp and rev are what the
// caller last read or wrote.
func (c *checkpointStore) settle(ctx context.Context, h *held, cp checkpoint, rev uint64) error {
	for range 5 {
		if cp.Applied >= h.seq {
			return nil
		}
		next := checkpoint{Applied: h.seq, EventID: h.event.ID()}
		_, err := c.write(ctx, h.lane, next, rev)
		if err == nil {
			return nil
		}
		if !errors.Is(err, events.ErrConflict) {
			return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), err)
		}
		if cp, rev, _, err = c.read(ctx, h.lane); err != nil {
			return err
		}
	}
	return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), events.ErrConflict)
}

// forget drops the lane's cached checkpoint, so the next event of the key
// reads it from the bucket.
func (c *checkpointStore) forget(lane string) { c.cache.drop(lane) }

// untrusted says the lane's stored checkpoint, as last read, did not
// verify.
func (c *checkpointStore) untrusted(lane string) bool { return c.cache.untrusted(lane) }

// cpCacheSize bounds the checkpoints cached per worker instance: enough for
// every key of a busy instance, small enough to ignore for a fleet host.
const cpCacheSize = 4096

// cachedCP is a checkpoint as this process last read or wrote it, valid
// while the worker's delivery epoch is unchanged.
type cachedCP struct {
	cp    checkpoint
	rev   uint64
	epoch uint64
	// untrusted says the stored checkpoint did not verify, so cp is the
	// empty one it counts as (orderFloor).
	untrusted bool
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

// untrusted says the lane's stored checkpoint, as last read, did not
// verify.
func (c *cpCache) untrusted(lane string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.entries[lane].untrusted
}

func (c *cpCache) drop(lane string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, lane)
}
