package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/bench"
	"github.com/steward-dev/steward/workers"
)

func newBenchCmd(g *globals) *cobra.Command {
	var (
		o                 bench.Options
		watermill, server string
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the runtime against raw JetStream consumers and Watermill",
		Long: `Start a NATS server with JetStream (its store in a temporary folder), in a
process of its own as a deployed worker meets its server (--server process,
this binary's embedded nats-server), or inside this process with the paths
(--server embedded, where every path shares its garbage collector with the
server's), and publish --events events, as one burst or at --rate events per second,
through each path in turn: a no-op worker run by the runtime on the streams
` + "`steward setup`" + ` makes (every event reaches the handler, is checkpointed and its
ack confirmed); on a plain stream, made as a nats.go user makes one (subjects
and file storage), a pull consumer that acks fire-and-forget, one that
confirms each ack serially (DoubleAck), and the same serial consumer decoding
and validating each event before its handler as every worker does, and that
consumer writing each event's key's checkpoint (compare-and-set, in a bucket
of its own) before it confirms the ack, the least a consumer of its own does
to keep the runtime's guarantees; and the fire-and-forget consumer on a
stream laid out as STEWARD_EVENTS is, stored notices included.
--stream-costs adds that consumer on the STEWARD_EVENTS layout with one of
its costs switched off at a time (the stored notices, the Nats-Msg-Id the
duplicate window tracks, the CloudEvents headers), and the runtime on
STEWARD_EVENTS without its stored notices, as steward setup --stored-notices
none leaves it, held against the runtime after the same updates of the
stream with its notices kept, so that the two turns differ in the notices
alone.
--watermill adds Watermill's JetStream subscriber (watermill-nats v2, AckSync)
on the plain stream, run by its own program: the folder of its module
(internal/bench/watermill in a checkout, built first with go build) or the
program built from it.

Each path first gets a short unmeasured burst, so none pays for the process's
cold start; then --rounds rounds measure each path once, the first path
changing from round to round. For each path it prints events per second
consumed and published, the p50 and p99 of two latencies, publish to the
handler and publish to settled, how many of the slowest 1% to reach their
handler were published within 40ms of each other (when many were, a stall
that every event behind it waited out made the p99 more than the path
did), the CPU time per event (with the server in a process of its own,
the server's part of it: what the path asks of the server), the bytes
its process allocated per event with the garbage collections they cost,
and on the consumers that decode and validate, how long that took where
it ran, timed event by event (medians over the rounds), then the ratios
the targets are stated in (the medians of each round's own) and each
round's. Compare figures within one run only: the machine is shared and
absolute figures drift.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Rounds < 1 {
				return fmt.Errorf("--rounds %d: want at least 1", o.Rounds)
			}
			switch server {
			case "process":
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("bench: this binary, to run its embedded nats-server in a process of its own: %w", err)
				}
				o.ServerCommand = []string{exe, "bench", fleetServerCmd}
			case "embedded":
			default:
				return fmt.Errorf("--server %q: want process (the server in a process of its own) or embedded (in this process, with the paths)", server)
			}
			if watermill != "" {
				dir, err := os.MkdirTemp("", "steward-bench-watermill-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				program, err := bench.ExternalCommand(cmd.Context(), watermill, dir)
				if err != nil {
					return fmt.Errorf("--watermill: %w", err)
				}
				o.External = &bench.External{Name: "Watermill AckSync, plain stream", Command: program}
			}
			out := cmd.OutOrStdout()
			mode := "as one burst"
			if o.Rate > 0 {
				mode = fmt.Sprintf("at %d events/s", o.Rate)
			}
			fmt.Fprintf(out, "publishing %s over %s %s through each path, %s...\n", plural(o.Events, "event"), plural(o.Keys, "key"), mode, plural(o.Rounds, "round"))
			o.Progress = func(path string, settled, total int) {
				fmt.Fprintf(cmd.ErrOrStderr(), "  %s: %d of %d settled\n", path, settled, total)
			}
			res, err := bench.Run(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			fmt.Fprint(out, res.String())
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Events, "events", bench.DefaultEvents, "events published through each path")
	fs.IntVar(&o.Keys, "keys", 64, "distinct keys the events spread over")
	fs.IntVar(&o.Concurrency, "concurrency", workers.DefaultConcurrency, "the runtime's concurrency (keys handled at once)")
	fs.IntVar(&o.Rate, "rate", 0, "publish at this many events per second instead of one burst")
	fs.IntVar(&o.Rounds, "rounds", 3, "how many times each path is measured; the report gives the medians")
	fs.BoolVar(&o.StreamCosts, "stream-costs", false, "add the fire-and-forget consumer on the STEWARD_EVENTS layout with its stored notices, its Nats-Msg-Id and its CloudEvents headers switched off in turn, and the runtime on STEWARD_EVENTS without its stored notices (steward setup --stored-notices none) and with them after the same stream updates")
	fs.StringVar(&watermill, "watermill", "", "add Watermill's JetStream subscriber (AckSync), run by the program at this path or built from the module in this folder (internal/bench/watermill)")
	fs.StringVar(&server, "server", "process", "where the server runs: process (its own, as a deployed worker meets it) or embedded (in this process, sharing its garbage collector with every path)")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up on a path after this long")
	cmd.AddCommand(newBenchFleetCmd(g), newBenchFleetServerCmd())
	cmd.AddCommand(newBenchMemoryCmd(g))
	return cmd
}
