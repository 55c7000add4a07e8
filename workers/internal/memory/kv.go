package memory

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// KV is a key-value bucket in memory with the rules of a JetStream bucket
// that the checkpoint store relies on: one revision counter shared by every
// key (the bucket's stream sequence, so a revision read for one key never
// matches another's), Create refused over a live key, Update refused over
// any revision but the current one, Delete leaving a tombstone that Create
// may replace.
//
// It implements the jetstream.KeyValue methods events.Store and State use;
// the others are the embedded nil interface's, so a new use panics in the
// first test that makes it rather than doing something quietly wrong.
type KV struct {
	jetstream.KeyValue

	// Fail, when set, is asked before every write; an error it returns is
	// the write's, and nothing is written (a bucket that is down, or
	// full).
	Fail func(key string) error
	// Written, when set, is told of every value written, in order.
	Written func(key string, value []byte)

	mu      sync.Mutex
	bucket  string
	rev     uint64
	entries map[string]*entry
}

// NewKV returns an empty bucket named bucket.
func NewKV(bucket string) *KV { return &KV{bucket: bucket, entries: map[string]*entry{}} }

// Bucket is the bucket's name.
func (kv *KV) Bucket() string { return kv.bucket }

// Get returns the key's current value; jetstream.ErrKeyNotFound when it has
// none (never written, or deleted).
func (kv *KV) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	e, ok := kv.entries[key]
	if !ok || e.deleted {
		return nil, jetstream.ErrKeyNotFound
	}
	return e, nil
}

// Put writes value whatever the key holds.
func (kv *KV) Put(_ context.Context, key string, value []byte) (uint64, error) {
	return kv.write(key, value, func(*entry) error { return nil })
}

// Create writes value only when the key has no live value.
func (kv *KV) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	return kv.write(key, value, func(cur *entry) error {
		if cur != nil && !cur.deleted {
			return fmt.Errorf("create %s in %s: %w", key, kv.bucket, jetstream.ErrKeyExists)
		}
		return nil
	})
}

// Update writes value only when the key is at revision rev.
func (kv *KV) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return kv.write(key, value, func(cur *entry) error {
		if cur == nil || cur.revision != rev {
			return fmt.Errorf("update %s in %s at revision %d: %w", key, kv.bucket, rev, jetstream.ErrKeyRevisionMismatch)
		}
		return nil
	})
}

// Delete leaves a tombstone under key.
func (kv *KV) Delete(_ context.Context, key string, _ ...jetstream.KVDeleteOpt) error {
	_, err := kv.write(key, nil, func(cur *entry) error {
		if cur == nil || cur.deleted {
			return jetstream.ErrKeyNotFound
		}
		return nil
	})
	return err
}

func (kv *KV) write(key string, value []byte, allowed func(cur *entry) error) (uint64, error) {
	if kv.Fail != nil {
		if err := kv.Fail(key); err != nil {
			return 0, err
		}
	}
	kv.mu.Lock()
	if err := allowed(kv.entries[key]); err != nil {
		kv.mu.Unlock()
		return 0, err
	}
	kv.rev++
	e := &entry{bucket: kv.bucket, key: key, value: slices.Clone(value), revision: kv.rev, created: time.Now(), deleted: value == nil}
	kv.entries[key] = e
	rev := kv.rev
	kv.mu.Unlock()
	if kv.Written != nil && !e.deleted {
		kv.Written(key, e.value)
	}
	return rev, nil
}

// ListKeysFiltered lists the live keys that match any of filters (NATS
// subject wildcards: * one token, > the rest), in order.
func (kv *KV) ListKeysFiltered(_ context.Context, filters ...string) (jetstream.KeyLister, error) {
	kv.mu.Lock()
	var keys []string
	for k, e := range kv.entries {
		if !e.deleted && slices.ContainsFunc(filters, func(f string) bool { return events.FilterCovers(f, k) }) {
			keys = append(keys, k)
		}
	}
	kv.mu.Unlock()
	slices.Sort(keys)
	ch := make(chan string, len(keys))
	for _, k := range keys {
		ch <- k
	}
	close(ch)
	return keyList(ch), nil
}

// keyList is a listing already complete.
type keyList chan string

func (l keyList) Keys() <-chan string { return l }
func (l keyList) Stop() error         { return nil }

// entry is one revision of a key.
type entry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
	deleted     bool
}

func (e *entry) Bucket() string     { return e.bucket }
func (e *entry) Key() string        { return e.key }
func (e *entry) Value() []byte      { return e.value }
func (e *entry) Revision() uint64   { return e.revision }
func (e *entry) Created() time.Time { return e.created }
func (e *entry) Delta() uint64      { return 0 }
func (e *entry) Operation() jetstream.KeyValueOp {
	if e.deleted {
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}
