package workers

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// ensureBus makes sure the three streams and the checkpoint bucket exist,
// with replicas copies and the default limits when it creates them, and
// returns the bucket (events.CreateMissingBus: what exists is left as the
// operator set it).
func ensureBus(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	return events.CreateMissingBus(ctx, js, events.DefaultBusConfig(replicas))
}
