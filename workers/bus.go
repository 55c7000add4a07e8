package workers

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// Defaults of the checkpoint bucket's limits, set explicitly like the
// streams' (a limit left to the server is one the server may change).
const (
	// DefaultCheckpointMaxBytes bounds STEWARD_CHECKPOINTS. A checkpoint is
	// a few hundred bytes per key and instance; a fleet of ten thousand
	// hosts with a hundred keys each fits many times over.
	DefaultCheckpointMaxBytes = 4 << 30
	// DefaultCheckpointMaxValueSize bounds one checkpoint with the stage
	// its handler saved.
	DefaultCheckpointMaxValueSize = 1 << 20
)

// BusConfig is what `steward setup` creates or updates: the three streams
// and the checkpoint bucket, with their limits.
type BusConfig struct {
	Streams events.StreamConfig
	// CheckpointMaxBytes bounds the checkpoint bucket; full, it refuses
	// new checkpoints (the event is retried, never acked unrecorded).
	CheckpointMaxBytes int64
	// CheckpointMaxValueSize bounds one checkpoint.
	CheckpointMaxValueSize int32
}

// DefaultBusConfig is events.DefaultStreamConfig and the Default
// checkpoint limits, with replicas copies of everything.
func DefaultBusConfig(replicas int) BusConfig {
	sc := events.DefaultStreamConfig()
	sc.Replicas = max(replicas, 1)
	return BusConfig{Streams: sc, CheckpointMaxBytes: DefaultCheckpointMaxBytes, CheckpointMaxValueSize: DefaultCheckpointMaxValueSize}
}

func (c BusConfig) bucket() jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       CheckpointBucket,
		Description:  "Steward workers' checkpoints and state",
		Storage:      jetstream.FileStorage,
		Replicas:     max(c.Streams.Replicas, 1),
		MaxBytes:     c.CheckpointMaxBytes,
		MaxValueSize: c.CheckpointMaxValueSize,
	}
}

// SetupBus creates the streams and the checkpoint bucket, or updates them
// to cfg, limits included. It is the operator's act (`steward setup`, and
// `steward dev` at start); workers call only what creates what is missing.
func SetupBus(ctx context.Context, js jetstream.JetStream, cfg BusConfig) error {
	if cfg.CheckpointMaxBytes < 1 || cfg.CheckpointMaxValueSize < 1 {
		return fmt.Errorf("checkpoint max bytes %d and max value size %d: want both positive", cfg.CheckpointMaxBytes, cfg.CheckpointMaxValueSize)
	}
	if err := events.EnsureStreams(ctx, js, cfg.Streams); err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, cfg.bucket()); err != nil {
		return fmt.Errorf("create or update KV bucket %s (replicas %d): %w", CheckpointBucket, cfg.Streams.Replicas, err)
	}
	return nil
}

// ensureBus makes sure the three streams and the checkpoint bucket exist
// and returns the bucket. It creates only what is missing, with replicas
// copies and the default limits, so a bus without authorization works with
// no set-up; what exists is left exactly as the operator set it, since a
// worker that rewrote the limits at every start would undo `steward setup`.
// A worker whose identity may not create them is told which is missing and
// that `steward setup` creates it.
func ensureBus(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	cfg := DefaultBusConfig(replicas)
	if err := events.CreateMissingStreams(ctx, js, cfg.Streams); err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, CheckpointBucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("look up KV bucket %s: %w", CheckpointBucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg.bucket())
	if errors.Is(err, jetstream.ErrBucketExists) {
		// Created meanwhile by another process: use theirs.
		kv, err = js.KeyValue(ctx, CheckpointBucket)
	}
	if err != nil {
		if errors.Is(err, nats.ErrPermissionViolation) {
			err = fmt.Errorf("this NATS identity may not manage buckets (%w)", err)
		}
		return nil, fmt.Errorf("KV bucket %s does not exist and could not be created: %w; "+
			"create it with `steward setup` run with operator credentials (--nats-creds)", CheckpointBucket, err)
	}
	return kv, nil
}
