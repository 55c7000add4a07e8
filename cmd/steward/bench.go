package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/bench"
	"github.com/steward-dev/steward/workers"
)

func newBenchCmd(g *globals) *cobra.Command {
	var o bench.Options
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the runtime against a raw JetStream consumer on an embedded server",
		Long: `Start an embedded NATS server with JetStream (its store in a temporary folder),
publish --events events as one burst through a no-op worker run by the runtime,
then the same number through a plain pull consumer with explicit acks, and
print events per second and the p50 and p99 publish-to-handled latency of each,
and the ratio of the two rates. The runtime's price is what it does per event
that the raw consumer does not: validation, the per-key lanes, a checkpoint
read and a compare-and-swap write, and a confirmed ack.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "publishing %d events over %d keys through each path...\n", o.Events, o.Keys)
			res, err := bench.Run(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			fmt.Fprint(cmd.OutOrStdout(), res.String())
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Events, "events", bench.DefaultEvents, "events published through each path")
	fs.IntVar(&o.Keys, "keys", 64, "distinct keys the events spread over")
	fs.IntVar(&o.Concurrency, "concurrency", workers.DefaultConcurrency, "the runtime's concurrency (keys handled at once)")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up on a path after this long")
	return cmd
}
