package ops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/redact"
)

// Checkpoint is what a worker instance's runtime keeps for one key in
// STEWARD_CHECKPOINTS (docs/design.md §3): the last stream sequence it
// settled, that event's id, and the stage a handler saved for the event
// it is working on, secrets elided.
type Checkpoint struct {
	Instance string `json:"instance"`
	Type     string `json:"type"`
	Key      string `json:"key"`
	// BucketKey is the checkpoint's key in the bucket
	// (cp.<worker>.<instance>.<kind>.<key>).
	BucketKey string `json:"bucketKey"`
	// Applied is the STEWARD_EVENTS sequence last settled (applied,
	// refused, superseded or dead-lettered); EventID is that event's.
	Applied uint64 `json:"applied"`
	EventID string `json:"eventId,omitempty"`
	// StageSeq is the sequence of the event the saved Stage belongs to;
	// a redelivery of that event resumes from it.
	StageSeq uint64 `json:"stageSeq,omitempty"`
	// Stage is the saved stage as pretty JSON, secret-named fields and
	// armored blocks elided (ElideData); "" when none is saved.
	Stage string `json:"stage,omitempty"`
	// Revision and Updated are the bucket entry's.
	Revision uint64    `json:"revision"`
	Updated  time.Time `json:"updated"`
	// Error says the entry is not a checkpoint the runtime can read, or
	// does not verify as the instance's (then the runtime does not believe
	// it either: it reads the key's events again).
	Error string `json:"error,omitempty"`
	// Forged says it did not verify.
	Forged bool `json:"forged,omitempty"`
}

// GetCheckpoints reads the checkpoints of one key of a worker, one per
// instance and kind of event the worker consumes (only instance's when
// instance is set), from one watch of the bucket. A bucket that does not
// exist yet holds none.
//
// docs verifies each checkpoint as its instance's; nil reads them without
// keys (shown, not verified).
func GetCheckpoints(ctx context.Context, js jetstream.JetStream, docs *events.Store, worker, key, instance string) ([]Checkpoint, error) {
	if err := events.CheckKey(worker); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if key == "" {
		return nil, errors.New("no key given: name the key whose checkpoints to read")
	}
	inst := "*"
	if instance != "" {
		if err := events.CheckKey(instance); err != nil {
			return nil, fmt.Errorf("instance: %w", err)
		}
		inst = instance
	}
	if docs == nil {
		kv, err := js.KeyValue(ctx, events.CheckpointBucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return []Checkpoint{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("open bucket %s on %s: %w", events.CheckpointBucket, ServerURL(js), err)
		}
		docs = events.NewStore(kv, events.StoreOptions{})
	}
	types := WorkerTypes(worker)
	var filters []string
	for _, t := range types {
		filters = append(filters, events.CheckpointKey(worker, inst, t, key))
	}
	w, err := docs.KV().WatchFiltered(ctx, filters, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read the checkpoints of %s in %s: %w", key, events.CheckpointBucket, err)
	}
	defer func() { _ = w.Stop() }()
	out := []Checkpoint{}
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read the checkpoints of %s in %s: %w", key, events.CheckpointBucket, ctx.Err())
		case e = <-w.Updates():
		}
		if e == nil {
			break // every stored entry has been sent
		}
		parts := strings.SplitN(e.Key(), ".", 4) // cp, worker, instance, lane
		if len(parts) != 4 {
			continue
		}
		cp := Checkpoint{Instance: parts[2], Key: key, BucketKey: e.Key(), Revision: e.Revision(), Updated: e.Created().UTC()}
		for _, t := range types {
			if events.CheckpointKey(worker, cp.Instance, t, key) == e.Key() {
				cp.Type = t
			}
		}
		var s events.Checkpoint
		d := docs.Open(ctx, e)
		if d.Forgery != nil {
			cp.Forged = true
			cp.Error = redact.Secrets(fmt.Sprintf("does not verify (%s): the runtime does not believe it and reads the key's events again; find who wrote it (docs/design.md §7)", d.Forgery.Reason))
		} else if err := d.Decode(&s); err != nil {
			cp.Error = fmt.Sprintf("not a checkpoint the runtime can read (%v): the runtime fails on this key until the entry is fixed or deleted (nats kv del %s %s)", err, events.CheckpointBucket, e.Key())
		} else {
			cp.Applied, cp.EventID, cp.StageSeq = s.Applied, Printable(s.EventID), s.StageSeq
			if len(s.Stage) > 0 && string(s.Stage) != "null" {
				cp.Stage = ElideData(s.Stage, false)
			}
		}
		out = append(out, cp)
	}
	slices.SortFunc(out, func(a, b Checkpoint) int {
		return cmp.Or(strings.Compare(a.Instance, b.Instance), strings.Compare(a.Type, b.Type))
	})
	return out, nil
}
