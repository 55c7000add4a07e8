package workers

import (
	"context"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Handler applies one event. It must be idempotent: after a crash the same
// event is delivered again, with the stage it saved (Delivery.LoadStage).
// Its result decides the event's fate, as the package documentation says.
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
	// Rank, when set, makes the kind latest-wins: an event not yet applied
	// is superseded by a newer one of its order key. Rank verifies the
	// event as Handle would and returns its place in the key's order (a
	// generation, a version, a signed time): greater is newer. An error
	// means the event does not verify, or takes part in no choice
	// (ErrUnranked): it supersedes nothing, is never superseded, and is
	// handed to Handle in its turn. Rank must refuse whatever Handle would
	// refuse, since the events it supersedes are never applied. Leave it
	// nil where every event is a step (converge applies releases in order).
	Rank func(ctx context.Context, d *Delivery) (uint64, error)
	// Unchanged names the outcomes by which the handler says it found
	// nothing to change (a stale version skipped, a box already armed, a
	// floor already kept). A replayed event whose handler returned nil and
	// emitted only these (or events.OutcomeSuperseded) is ReplayUnchanged rather
	// than ReplayApplied.
	Unchanged []string
}

// Defaults of the runtime's options.
const (
	DefaultAckWait    = 30 * time.Second
	DefaultMaxDeliver = 100
	// DefaultMaxPanics is how often a handler may panic on one event
	// before it goes to the DLQ.
	DefaultMaxPanics = 5
	// DefaultMaxBackoff caps the delay between two attempts of a
	// failing event.
	DefaultMaxBackoff    = 2 * time.Minute
	DefaultConcurrency   = 32
	DefaultShutdownGrace = 30 * time.Second
)

// defaultStatusInterval is how often, at most, the status document of
// retrying keys is written.
const defaultStatusInterval = 5 * time.Second
