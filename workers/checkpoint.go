package workers

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/steward-dev/steward/events"
)

// checkpoint is the document the runtime keeps per instance and lane
// (events.Checkpoint, stored under events.CheckpointKey).
type checkpoint = events.Checkpoint

// laneOf names what orders and checkpoints an event (events.Lane).
func laneOf(typ, key string) string { return events.Lane(typ, key) }

func (w *Runtime) checkpointKey(lane string) string {
	return events.LaneCheckpointKey(w.spec.Name, w.spec.Instance, lane)
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

// getCheckpoint reads the lane's checkpoint. One that does not verify as
// this instance's counts as absent (its events are decided again, and the
// stage it names is discarded), but its revision is returned, so the next
// write replaces it.
func (w *Runtime) getCheckpoint(ctx context.Context, lane string) (checkpoint, uint64, error) {
	var cp checkpoint
	epoch := w.epoch.Load()
	doc, err := w.store.Get(ctx, w.checkpointKey(lane))
	if err != nil {
		return cp, 0, fmt.Errorf("read checkpoint of %s: %w", lane, err)
	}
	if err := doc.Decode(&cp); err != nil {
		return cp, 0, err
	}
	w.cps.put(lane, cachedCP{cp: cp, rev: doc.Revision, epoch: epoch, untrusted: doc.Present() && !doc.Trusted})
	return cp, doc.Revision, nil
}

func (w *Runtime) putCheckpoint(ctx context.Context, lane string, cp checkpoint, rev uint64) (uint64, error) {
	// The epoch is read before the write: a gap seen meanwhile leaves the
	// cached entry stale, and the next event of the lane reads again.
	epoch := w.epoch.Load()
	next, err := w.store.Put(ctx, w.checkpointKey(lane), cp, rev)
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
		if !errors.Is(err, events.ErrConflict) {
			return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), err)
		}
		if cp, rev, err = w.getCheckpoint(ctx, h.lane); err != nil {
			return err
		}
	}
	return fmt.Errorf("record %s settled at sequence %d (event %s): %w", h.key, h.seq, h.event.ID(), events.ErrConflict)
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

// orderFloor is the sequence at or below which every event of h's lane is
// known to be settled, for the order scan: the checkpoint's, or, when the
// stored checkpoint did not verify and so counts as absent, the consumer's
// ack floor (what was acknowledged was settled), so an event does not wait
// for earlier ones that were settled long ago and will never come back.
// That costs one consumer info, only on the path of a forged document.
func (w *Runtime) orderFloor(ctx context.Context, h *held, cp checkpoint) (uint64, error) {
	if w.consumer == nil || !w.cps.untrusted(h.lane) {
		return cp.Applied, nil
	}
	info, err := w.consumer.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the ack floor of %s after the checkpoint of %s did not verify: %w", w.consumerName(), h.key, err)
	}
	return max(cp.Applied, info.AckFloor.Stream), nil
}

func (c *cpCache) drop(lane string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, lane)
}
