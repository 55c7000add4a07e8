package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BusConfig is what `steward setup` creates or updates: the three streams
// and the checkpoint bucket, with their limits.
type BusConfig struct {
	Streams StreamConfig
	// CheckpointMaxBytes bounds the checkpoint bucket; full, it refuses
	// new checkpoints (the event is retried, never acked unrecorded).
	CheckpointMaxBytes int64
	// CheckpointMaxValueSize bounds one checkpoint.
	CheckpointMaxValueSize int32
}

// DefaultBusConfig is DefaultStreamConfig and the Default checkpoint
// limits, with replicas copies of everything.
func DefaultBusConfig(replicas int) BusConfig {
	sc := DefaultStreamConfig()
	sc.Replicas = max(replicas, 1)
	return BusConfig{Streams: sc, CheckpointMaxBytes: DefaultCheckpointMaxBytes, CheckpointMaxValueSize: DefaultCheckpointMaxValueSize}
}

// SetupBus creates the streams and the checkpoint bucket, or updates them
// to cfg, limits included. It is the operator's act (`steward setup`, and
// `steward dev` at start); workers call CreateMissingBus, which creates
// only what is missing.
func SetupBus(ctx context.Context, js jetstream.JetStream, cfg BusConfig) error {
	if cfg.CheckpointMaxBytes < 1 || cfg.CheckpointMaxValueSize < 1 {
		return fmt.Errorf("checkpoint max bytes %d and max value size %d: want both positive", cfg.CheckpointMaxBytes, cfg.CheckpointMaxValueSize)
	}
	if err := EnsureStreams(ctx, js, cfg.Streams); err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateKeyValue(ctx, cfg.bucketConfig()); err != nil {
		return fmt.Errorf("create or update KV bucket %s (replicas %d): %w", CheckpointBucket, cfg.Streams.Replicas, err)
	}
	return nil
}

// CreateMissingBus makes sure the three streams and the checkpoint bucket
// exist and returns the bucket. It creates only what is missing, with cfg,
// so a bus without authorization works with no set-up; what exists is left
// exactly as the operator set it, since a worker that rewrote the limits at
// every start would undo `steward setup`. An identity that may not create
// them is told which is missing and that `steward setup` creates it.
func CreateMissingBus(ctx context.Context, js jetstream.JetStream, cfg BusConfig) (jetstream.KeyValue, error) {
	if err := CreateMissingStreams(ctx, js, cfg.Streams); err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, CheckpointBucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("look up KV bucket %s: %w", CheckpointBucket, err)
	}
	kv, err = js.CreateKeyValue(ctx, cfg.bucketConfig())
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

// bucketConfig is the checkpoint bucket's JetStream configuration.
func (c BusConfig) bucketConfig() jetstream.KeyValueConfig {
	return checkpointBucketConfig(max(c.Streams.Replicas, 1), c.CheckpointMaxBytes, c.CheckpointMaxValueSize)
}
