package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/workers"
	"github.com/steward-dev/steward/workers/replay"
)

// replayReport is what `steward replay` prints with --json: every event's
// result, then the counts.
type replayReport struct {
	Server   string         `json:"server"`
	Consumer string         `json:"consumer"`
	DryRun   bool           `json:"dryRun"`
	Events   []replayLine   `json:"events"`
	Total    int            `json:"total"`
	Counts   map[string]int `json:"counts"`
}

type replayLine struct {
	Sequence uint64   `json:"sequence"`
	ID       string   `json:"id"`
	Type     string   `json:"type"`
	Key      string   `json:"key"`
	Verdict  string   `json:"verdict"`
	Outcomes []string `json:"outcomes"`
	Error    string   `json:"error,omitempty"`
}

// replayVerdicts are the verdicts a summary counts, in the order it names
// them.
var replayVerdicts = []string{replay.Applied, replay.Failed, replay.Unchanged, replay.Refused,
	replay.DeadLetter, replay.Invalid, replay.WouldHandle}

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
consumer: checkpoints are neither read nor moved, no stage is saved and no
dead letter written. The handler's own idempotency decides what a replayed
event changes.

Each event is reported by the runtime's rules: applied (the handler returned
nil), unchanged (it returned nil and emitted only outcomes saying nothing
needed changing: skipped, armed-already, floor-kept, superseded), refused,
dead-letter (a permanent error: the consumer would have dead-lettered it),
failed (any other error: the consumer would have retried it) or invalid.

Outcomes a replay emits go to the instance's outcome subject marked with the
extension replay=true and a replayid naming the run, under ids of their own,
so a console, 'steward history' and an audit tell them from the live ones.

With --dry-run each event is decoded and validated and nothing is handled, so
only the instance's flag (--install, --box, --hive, --machine) is needed.
A replay creates no durable state: no consumer, stream or bucket.

One line is printed per event, then a summary (--json: one report); progress
goes to stderr when it takes over a second. The exit status is 1 when an event
failed or would be dead-lettered (outside --dry-run). An invalid event is
reported and counted, and does not fail the replay: the stream keeps what was
published, and the consumer dead-lettered it when it came (steward dlq ls), so
one old invalid event would otherwise fail every replay for as long as the
stream keeps it.`,
		Example: `  steward replay credential --hive h1 --since 1h --dry-run
  steward replay credential --hive h1 --age-identity h1.key --credential-dir /run/h1 --since 1h`,
	}
	out := addOutputFlags(cmd)
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
			asJSON, err := out.asJSON()
			if err != nil {
				return err
			}
			startTime, err := startPoint(fromSeq, since, time.Now())
			if err != nil {
				return err
			}
			from := replay.From{Sequence: fromSeq, Time: startTime}
			var (
				spec    workers.Spec
				handler workers.Handler
			)
			if dryRun {
				if spec, handler, err = k.dryRunSpec(cmd.Flags()); err != nil {
					return fmt.Errorf("%s worker: %w", k.name, err)
				}
			} else {
				h, err := build()
				if err != nil {
					return fmt.Errorf("%s worker: %w", k.name, err)
				}
				defer h.Close()
				spec, handler = h.Spec(), h
			}
			ctx := cmd.Context()
			nc, js, err := g.connect(ctx, "steward replay "+k.name, false)
			if err != nil {
				return err
			}
			defer nc.Close()
			// The replayed outcomes are signed as whoever runs the replay
			// (the instance, or the operator, whose proof readers accept on
			// a replayed outcome): with a key only this process knew they
			// would show as forged (docs/design.md §7).
			signer, verifier, err := g.documentKeys(g.credsName())
			if err != nil {
				return fmt.Errorf("%s worker: %w", k.name, err)
			}
			r, err := replay.New(ctx, js, spec, handler, workers.WithLogger(g.log), workers.WithDocumentKeys(signer, verifier), workers.WithDomain(g.jsDomain))
			if err != nil {
				return fmt.Errorf("%s worker: %w", k.name, err)
			}
			stdout := cmd.OutOrStdout()
			rep := replayReport{Server: nc.ConnectedUrlRedacted(), Consumer: r.ConsumerName(), DryRun: dryRun,
				Events: []replayLine{}, Counts: map[string]int{}}
			for _, v := range replayVerdicts {
				rep.Counts[v] = 0
			}
			prog := startProgress(cmd.ErrOrStderr(), stdout, "replayed")
			err = r.Replay(ctx, from, dryRun, prog.setTotal, func(res replay.Result) {
				prog.add(1)
				l := replayLine{Sequence: res.Sequence, ID: res.ID, Type: res.Type, Key: res.Key, Verdict: res.Verdict, Outcomes: res.Outcomes}
				if res.Err != nil {
					l.Error = replayErrText(res.Err)
				}
				rep.Total++
				rep.Counts[res.Verdict]++
				if asJSON {
					rep.Events = append(rep.Events, l)
					return
				}
				printReplayLine(stdout, l)
			})
			prog.finish()
			if err != nil {
				return withServerHint(g, fmt.Errorf("replay %s: %w", r.ConsumerName(), err))
			}
			if asJSON {
				if err := printJSON(stdout, rep); err != nil {
					return err
				}
			} else {
				fmt.Fprintln(stdout, replaySummary(rep))
			}
			bad := rep.Counts[replay.Failed] + rep.Counts[replay.DeadLetter]
			if !dryRun && bad > 0 {
				return fmt.Errorf("%d of %d replayed events failed or would be dead-lettered (see the report above): fix the cause, then replay from the first of them", bad, rep.Total)
			}
			return nil
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

func printReplayLine(w io.Writer, l replayLine) {
	verdict := l.Verdict
	switch l.Verdict {
	case replay.WouldHandle:
		verdict = "would be handled"
	case replay.DeadLetter:
		verdict = "would be dead-lettered"
	}
	if len(l.Outcomes) > 0 {
		verdict += " (outcomes: " + strings.Join(l.Outcomes, ", ") + ")"
	}
	if l.Error != "" {
		verdict += ": " + l.Error
	}
	fmt.Fprintln(w, ops.Printable(fmt.Sprintf("seq=%d id=%s type=%s key=%s %s", l.Sequence, l.ID, l.Type, l.Key, verdict)))
}

func replaySummary(rep replayReport) string {
	c := rep.Counts
	if rep.DryRun {
		return fmt.Sprintf("dry run of %s: %d events, %d would be handled, %d invalid", rep.Consumer, rep.Total, c[replay.WouldHandle], c[replay.Invalid])
	}
	return fmt.Sprintf("replayed %d events through %s: %d applied, %d failed, %d unchanged, %d refused, %d would be dead-lettered, %d invalid",
		rep.Total, rep.Consumer, c[replay.Applied], c[replay.Failed], c[replay.Unchanged], c[replay.Refused],
		c[replay.DeadLetter], c[replay.Invalid])
}

// replayErrText is an event's error on one line, for a report.
func replayErrText(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
