package events

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream names: the three streams every part of Steward agrees on.
const (
	StreamEvents   = "STEWARD_EVENTS"
	StreamOutcomes = "STEWARD_OUTCOMES"
	StreamDLQ      = "STEWARD_DLQ"
)

// StreamConfig is how the three streams are laid out. The zero value is not
// useful; start from DefaultStreamConfig.
type StreamConfig struct {
	// Replicas is the copies each stream keeps (1, or 3 on a cluster).
	Replicas int
	// Dedupe is JetStream's duplicate window: an event republished with the
	// same id inside it is stored once.
	Dedupe time.Duration
	// Retention is how long events and outcomes are kept for replay.
	// Dead letters are kept until someone deals with them.
	Retention time.Duration
}

// DefaultStreamConfig is one replica, a two-minute dedupe window and thirty
// days of replay.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{Replicas: 1, Dedupe: 2 * time.Minute, Retention: 30 * 24 * time.Hour}
}

// StreamConfigs returns the JetStream configuration of the three streams.
func (c StreamConfig) StreamConfigs() []jetstream.StreamConfig {
	replicas := max(c.Replicas, 1)
	return []jetstream.StreamConfig{
		{
			Name: StreamEvents, Subjects: []string{EventsPrefix + ".>"},
			Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates: c.Dedupe, MaxAge: c.Retention,
			Description: "Steward state changes, kept for replay",
		},
		{
			Name: StreamOutcomes, Subjects: []string{OutcomesPrefix + ".>"},
			Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates: c.Dedupe, MaxAge: c.Retention,
			Description: "what Steward's workers did",
		},
		{
			Name: StreamDLQ, Subjects: []string{DLQPrefix + ".>"},
			Storage: jetstream.FileStorage, Replicas: replicas,
			Duplicates:  c.Dedupe,
			Description: "events a worker could not apply, with the reason",
		},
	}
}

// EnsureStreams creates the three streams or updates them to cfg. It is
// idempotent, so every process calls it at start.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	for _, sc := range cfg.StreamConfigs() {
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure stream %s (replicas %d): %w", sc.Name, sc.Replicas, err)
		}
	}
	return nil
}
