// Package workers is the runtime every Steward worker shares: it consumes a
// durable JetStream pull consumer, validates each event, runs the worker's
// Handler one key at a time in stream order, checkpoints progress in a KV
// bucket, retries what a retry can fix, and sends what it cannot fix to the
// dead-letter stream. A Handler only makes the world match one event.
package workers

import (
	"context"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Handler applies one event. It must be idempotent: after a crash the same
// event is delivered again, with the stage it saved (Delivery.LoadStage).
//
// Its result decides the event's fate: nil acknowledges it; an error marked
// Permanent sends it to the DLQ at once; any other error retries it with
// backoff until MaxDeliver, and then sends it to the DLQ. A panic counts as
// a retryable failure.
type Handler interface {
	Handle(ctx context.Context, d *Delivery) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, d *Delivery) error { return f(ctx, d) }

// Spec says what a worker is and what it consumes.
type Spec struct {
	// Name is the worker's name (converge, join, credential, provision).
	// Outcomes are typed dev.steward.<Name>.<outcome>.v1.
	Name string
	// Instance is what this instance serves: the install, box, hive or
	// machine. The durable consumer is "<Name>-<Instance>"; processes with
	// the same pair share its work. Outcomes and dead letters go to
	// steward.outcomes.<Name>.<Instance> and steward.dlq.<Name>.<Instance>.
	Instance string
	// Subjects the consumer filters on (at least one).
	Subjects []string
	// Types are the CloudEvents types the handler accepts; any other type
	// goes to the DLQ.
	Types []string
	// OrderKey returns the key that orders events: events with the same
	// order key are handled one at a time in stream order, checkpointed
	// together, and an event older than the last one applied for its order
	// key is skipped. The default is the event's key (its subject
	// attribute). Converge orders every release of one install together.
	OrderKey func(e event.Event) string
	// OutcomeNoun is the word outcome types start with:
	// dev.steward.<OutcomeNoun>.<outcome>.v1. The default is Name; the
	// provision worker's outcomes are grant.applied and grant.refused, as
	// the catalog names them.
	OutcomeNoun string
}

// Defaults of the runtime's options.
const (
	DefaultAckWait       = 30 * time.Second
	DefaultMaxDeliver    = 10
	DefaultConcurrency   = 32
	DefaultShutdownGrace = 30 * time.Second
	// CheckpointBucket is the KV bucket holding checkpoints and the
	// handlers' state.
	CheckpointBucket = "STEWARD_CHECKPOINTS"
)
