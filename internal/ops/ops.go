// Package ops computes the operator's views of a Steward bus: what is stuck
// and why (Status), what happened to one key (History), pausing and
// resuming a worker instance (Pause, Resume), the consumers Steward created
// (Consumers, RemoveConsumer) and versions (Build, Server).
//
// Every view takes a jetstream.JetStream and returns plain structs, ready for
// JSON, and prints nothing: `steward status` and a web console show the
// same facts from the same calls. Nothing here returns a secret: error texts
// read from status documents and dead letters have armored blocks and age
// identities elided again, whoever wrote them.
//
// Views are built to stay cheap at fleet size (ten thousand instances on one
// server): consumers are listed with one paged ListConsumers call, status
// documents read with one KV watch over rt.>, dead-letter depth from one
// stream info with a subject filter, and what costs a request per instance
// (the age of the oldest pending event) is computed only for the instances
// a page shows. A hub's sites come from the same consumer listing; each
// costs, through the hub, the same few requests in its own domain, and the
// age of its oldest unsent event a fixed few more when it is behind.
package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/steward-dev/steward/events"
)

// NoStreamsError says that the server asked holds none of Steward's
// streams: it is the wrong server, or nobody has run `steward setup` on it.
type NoStreamsError struct {
	// Server is the URL asked (its password redacted).
	Server string
}

func (e *NoStreamsError) Error() string {
	return fmt.Sprintf("the NATS server at %s holds none of Steward's streams (%s, %s, %s): point at the server Steward runs on, or create them with `steward setup`",
		e.Server, events.StreamEvents, events.StreamOutcomes, events.StreamDLQ)
}

// ServerURL is the URL of the server js is connected to, its password
// redacted, or "" when js has no connection.
func ServerURL(js jetstream.JetStream) string {
	if nc := js.Conn(); nc != nil {
		return nc.ConnectedUrlRedacted()
	}
	return ""
}

// ConsumerName is the durable consumer of a worker instance, as the runtime
// names it.
func ConsumerName(worker, instance string) string { return worker + "-" + instance }

// SplitConsumer reads the worker and the instance from a consumer the
// runtime created: its description ("Steward <worker> worker for
// <instance>") says both, even when the instance holds a '-'. ok is false
// for a consumer the runtime did not create.
func SplitConsumer(name, description string) (worker, instance string, ok bool) {
	rest, found := strings.CutPrefix(description, "Steward ")
	if !found {
		return "", "", false
	}
	worker, instance, found = strings.Cut(rest, " worker for ")
	if !found || ConsumerName(worker, instance) != name {
		return "", "", false
	}
	return worker, instance, true
}

// streamOrNone looks a stream up; a missing stream is (nil, nil).
func streamOrNone(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up stream %s on %s: %w", name, ServerURL(js), err)
	}
	return s, nil
}
