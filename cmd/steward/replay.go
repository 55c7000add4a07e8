package main

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/workers"
)

func newReplayCmd(g *globals) *cobra.Command {
	var (
		fromSeq uint64
		since   string
		dryRun  bool
	)
	cmd := &cobra.Command{
		Use:   "replay <worker>",
		Short: "Run stored events through a worker's handler again",
		Long: `Run the worker's events from STEWARD_EVENTS, from --from-seq or --since up to the
last one stored now, through its handler in stream order, outside its
consumer: checkpoints are neither read nor moved. The handler's own
idempotency decides what a replayed event changes. With --dry-run each event is
decoded and validated and nothing is handled. The worker's durable consumer is
created if it does not exist, as 'steward worker' would.

One line is printed per event, then a summary; the exit status is 1 when an
event failed (outside --dry-run).`,
		Example: `  steward replay credential --hive h1 --age-identity h1.key --credential-dir /run/h1 --since 1h --dry-run`,
	}
	pf := cmd.PersistentFlags()
	pf.Uint64Var(&fromSeq, "from-seq", 0, "first stream sequence to replay (default: the first kept)")
	pf.StringVar(&since, "since", "", "replay from this time on: RFC 3339 or a duration back from now (1h)")
	pf.BoolVar(&dryRun, "dry-run", false, "decode and validate only; nothing is handled")
	for _, k := range kinds {
		sub := &cobra.Command{
			Use:   k.name,
			Short: "Replay events through the " + k.name + " worker",
			Args:  cobra.NoArgs,
		}
		build := k.bind(sub.Flags())
		sub.RunE = func(cmd *cobra.Command, _ []string) error {
			startTime, err := startPoint(fromSeq, since, time.Now())
			if err != nil {
				return err
			}
			from := workers.ReplayFrom{Sequence: fromSeq, Time: startTime}
			h, err := build()
			if err != nil {
				return fmt.Errorf("%s worker: %w", k.name, err)
			}
			defer h.Close()
			ctx := cmd.Context()
			nc, js, err := g.connect(ctx, "steward replay "+k.name, false)
			if err != nil {
				return err
			}
			defer nc.Close()
			w, err := workers.New(ctx, js, h.Spec(), h,
				workers.WithLogger(g.log), workers.WithReplicas(g.replicas),
				workers.WithRegisterer(prometheus.NewRegistry()))
			if err != nil {
				return fmt.Errorf("%s worker: %w", k.name, err)
			}
			out := cmd.OutOrStdout()
			var total, failed int
			err = w.Replay(ctx, from, dryRun, func(r workers.ReplayResult) {
				total++
				verdict := "applied"
				switch {
				case r.Err != nil:
					failed++
					verdict = "failed: " + r.Err.Error()
				case dryRun:
					verdict = "would be handled"
				}
				fmt.Fprintf(out, "seq=%d id=%s type=%s key=%s %s\n", r.Sequence, r.ID, r.Type, r.Key, verdict)
			})
			if err != nil {
				return fmt.Errorf("replay %s: %w", w.ConsumerName(), err)
			}
			switch {
			case dryRun:
				fmt.Fprintf(out, "dry run of %s: %d events, %d would be handled, %d invalid\n", w.ConsumerName(), total, total-failed, failed)
			default:
				fmt.Fprintf(out, "replayed %d events through %s: %d applied, %d failed\n", total, w.ConsumerName(), total-failed, failed)
				if failed > 0 {
					return fmt.Errorf("%d of %d replayed events failed (see the lines above)", failed, total)
				}
			}
			return nil
		}
		cmd.AddCommand(sub)
	}
	return cmd
}
