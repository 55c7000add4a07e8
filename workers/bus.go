package workers

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// ensureBus ensures the three streams and the checkpoint bucket a worker
// needs, with replicas copies each, and returns the bucket.
func ensureBus(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	sc := events.DefaultStreamConfig()
	sc.Replicas = replicas
	if err := events.EnsureStreams(ctx, js, sc); err != nil {
		return nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      CheckpointBucket,
		Description: "Steward workers' checkpoints and state",
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("ensure KV bucket %s: %w", CheckpointBucket, err)
	}
	return kv, nil
}
