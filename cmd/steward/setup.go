package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
)

// newSetupCmd is the operator's command: it creates or updates the three
// streams and the checkpoint bucket with their limits. Workers create only
// what is missing and never overwrite what this command set.
func newSetupCmd(g *globals) *cobra.Command {
	var (
		cfg          = events.DefaultBusConfig(1)
		maxMsgSize   int
		cpValueBytes int
		notices      string
	)
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create or update Steward's streams and checkpoint bucket with their limits (an operator's command)",
		Long: `Create Steward's streams (STEWARD_EVENTS, STEWARD_OUTCOMES, STEWARD_DLQ) and the
checkpoint bucket (STEWARD_CHECKPOINTS), or update them, with --replicas copies
and every limit set explicitly. Run it with operator credentials (--nats-creds):
creating and changing them is an operator's right. Workers started later create
only what is missing, with the defaults, and never reset these limits.

A stream at a limit refuses new messages (the publisher sees the error naming
the limit and the flag here that raises it); it never drops stored ones.
--max-consumers must hold every worker instance of the fleet (one consumer each)
and a few for tools. --stored-notices is what STEWARD_EVENTS tells stream-reading
instances (--read-mode stream) about: the default covers every event; a bus no
instance reads in stream mode needs none, and saves the server a message an
event. Every flag has its STEWARD_* twin (--max-consumers is
STEWARD_MAX_CONSUMERS).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Streams.Replicas = g.replicas
			cfg.Streams.MaxMsgSize = int32(maxMsgSize)
			cfg.CheckpointMaxValueSize = int32(cpValueBytes)
			// Empty is refused, not read as none: an environment twin
			// left empty (a compose file's unset variable) would otherwise
			// turn the notices off, and every stream reader with them.
			switch notices {
			case "":
				return fmt.Errorf("--stored-notices is empty: want %s (the default, every event), a narrower filter under %s, or none", events.DefaultNotices, events.EventsPrefix)
			case "none":
				cfg.Streams.Notices = ""
			default:
				cfg.Streams.Notices = notices
			}
			if maxMsgSize != int(cfg.Streams.MaxMsgSize) || cpValueBytes != int(cfg.CheckpointMaxValueSize) {
				return fmt.Errorf("--max-msg-size %d and --checkpoint-max-value-size %d: want each below 2 GiB", maxMsgSize, cpValueBytes)
			}
			if err := cfg.Streams.Check(); err != nil {
				return fmt.Errorf("steward setup: %w", err)
			}
			ctx := cmd.Context()
			nc, js, err := g.connect(ctx, "steward setup", true)
			if err != nil {
				return err
			}
			defer nc.Close()
			// A cluster still electing its leaders refuses for a moment:
			// a one-shot set-up service waits that out rather than fail.
			if err := g.retry(ctx, "streams not set up yet", func() error { return events.SetupBus(ctx, js, cfg) }); err != nil {
				return fmt.Errorf("steward setup: %w", err)
			}
			out := cmd.OutOrStdout()
			for _, sc := range cfg.Streams.StreamConfigs() {
				fmt.Fprintf(out, "stream %s: replicas %d, max age %v, max bytes %d, max message size %d, max consumers %d, discard new\n",
					sc.Name, sc.Replicas, sc.MaxAge, sc.MaxBytes, sc.MaxMsgSize, sc.MaxConsumers)
			}
			storedNotices := "none (no instance may read it in stream mode)"
			if cfg.Streams.Notices != "" {
				storedNotices = cfg.Streams.Notices + " on " + events.StoredSubject(cfg.Streams.Notices)
			}
			fmt.Fprintf(out, "stored notices of %s: %s\n", events.StreamEvents, storedNotices)
			fmt.Fprintf(out, "bucket %s: replicas %d, max bytes %d, max value size %d\n",
				events.CheckpointBucket, cfg.Streams.Replicas, cfg.CheckpointMaxBytes, cfg.CheckpointMaxValueSize)
			var u events.Upgrade
			if err := g.retry(ctx, "upgrade record not written yet", func() (err error) { u, err = recordUpgrade(ctx, g, js); return err }); err != nil {
				return fmt.Errorf("steward setup: %w", err)
			}
			fmt.Fprintf(out, "upgrade record: unsigned documents at or below bucket sequence %d (recorded %s) are the previous version's, read once and signed again; any later one is forged\n",
				u.Sequence, u.At.Format(time.RFC3339))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&cfg.Streams.MaxConsumers, "max-consumers", events.DefaultMaxConsumers, "consumers STEWARD_EVENTS may hold: one per worker instance in the fleet, plus a few for tools")
	fs.Int64Var(&cfg.Streams.MaxBytes, "max-bytes", events.DefaultMaxBytes, "bytes STEWARD_EVENTS and STEWARD_OUTCOMES may each hold; full, they refuse new events")
	fs.IntVar(&maxMsgSize, "max-msg-size", events.DefaultMaxMsgSize, "the largest event, outcome or dead letter, in bytes")
	fs.DurationVar(&cfg.Streams.Retention, "retention", cfg.Streams.Retention, "how long events and outcomes are kept for replay and history")
	fs.DurationVar(&cfg.Streams.Dedupe, "dedupe", cfg.Streams.Dedupe, "the window in which an event republished with the same id is stored once")
	fs.DurationVar(&cfg.Streams.DLQMaxAge, "dlq-max-age", events.DefaultDLQMaxAge, "how long dead letters are kept")
	fs.Int64Var(&cfg.Streams.DLQMaxBytes, "dlq-max-bytes", events.DefaultDLQMaxBytes, "bytes STEWARD_DLQ may hold; full, it refuses new dead letters (the worker keeps retrying the event)")
	fs.Int64Var(&cfg.CheckpointMaxBytes, "checkpoint-max-bytes", events.DefaultCheckpointMaxBytes, "bytes the checkpoint bucket may hold")
	fs.IntVar(&cpValueBytes, "checkpoint-max-value-size", events.DefaultCheckpointMaxValueSize, "the largest checkpoint (with the stage a handler saved), in bytes")
	fs.StringVar(&notices, "stored-notices", events.DefaultNotices, "the events STEWARD_EVENTS sends stored notices of, which stream-reading instances wake on: a filter under steward.events ending in .> or naming one subject, or none")
	return cmd
}

// recordUpgrade writes the bucket's upgrade record as the operator
// (events.Store.RecordUpgrade), once.
func recordUpgrade(ctx context.Context, g *globals, js jetstream.JetStream) (events.Upgrade, error) {
	docs, err := g.documents(ctx, js)
	if err != nil {
		return events.Upgrade{}, err
	}
	if docs == nil {
		return events.Upgrade{}, fmt.Errorf("the bucket %s was not found after setting it up", events.CheckpointBucket)
	}
	return docs.RecordUpgrade(ctx)
}
