package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/ops"
)

// pauseForever is how far ahead a pause without --until is set: JetStream
// pauses only until a time, and a decade is until someone resumes it.
const pauseForever = 10 * 365 * 24 * time.Hour

func newPauseCmd(g *globals) *cobra.Command {
	var until string
	cmd := &cobra.Command{
		Use:   "pause <worker> <instance>",
		Short: "Stop the server delivering a worker instance's events, until --until or `steward resume`",
		Long: `Pause the worker instance's consumer (JetStream's consumer pause, nats-server
2.11 or later). The worker's processes keep running; events are kept and wait
at the server, nothing is lost, redelivered or dead-lettered, and what was
already delivered finishes. 'steward status' shows the instance as paused and
until when. Without --until the pause holds until 'steward resume'.`,
		Example: `  steward pause provision db-1 --until 30m
  steward pause credential hive-7 --until 2026-05-01T06:00:00Z`,
		Args: cobra.ExactArgs(2),
	}
	out := addOutputFlags(cmd)
	cmd.Flags().StringVar(&until, "until", "", "resume by itself at this time: RFC 3339, or a duration from now (30m) (default: until steward resume)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		at, err := parseUntil(until, time.Now())
		if err != nil {
			return err
		}
		nc, js, err := g.connect(cmd.Context(), "steward pause", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		docs, err := g.documents(cmd.Context(), js)
		if err != nil {
			return err
		}
		p, err := ops.Pause(cmd.Context(), js, docs, args[0], args[1], at)
		if err != nil {
			return withServerHint(g, err)
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), p)
		}
		when := "until `steward resume " + args[0] + " " + args[1] + "`"
		if until != "" && p.Until != nil {
			when = "until " + p.Until.Format(time.RFC3339) + " (or `steward resume " + args[0] + " " + args[1] + "`)"
		}
		fmt.Fprintln(cmd.OutOrStdout(), ops.Printable(fmt.Sprintf("paused %s %s; its events wait at the server", p.Consumer, when)))
		return nil
	}
	return cmd
}

func newResumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "resume <worker> <instance>",
		Short:   "Let the server deliver a paused worker instance's events again",
		Example: `  steward resume provision db-1`,
		Args:    cobra.ExactArgs(2),
	}
	out := addOutputFlags(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		nc, js, err := g.connect(cmd.Context(), "steward resume", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		docs, err := g.documents(cmd.Context(), js)
		if err != nil {
			return err
		}
		p, err := ops.Resume(cmd.Context(), js, docs, args[0], args[1])
		if err != nil {
			return withServerHint(g, err)
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), p)
		}
		fmt.Fprintln(cmd.OutOrStdout(), ops.Printable("resumed "+p.Consumer+"; the server delivers its events again"))
		if p.Note != "" {
			fmt.Fprintln(cmd.OutOrStdout(), ops.Printable("note: "+p.Note))
		}
		return nil
	}
	return cmd
}

// parseUntil reads --until: RFC 3339, or a positive duration from now;
// empty is pauseForever.
func parseUntil(v string, now time.Time) (time.Time, error) {
	if v == "" {
		return now.Add(pauseForever), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		if !t.After(now) {
			return time.Time{}, fmt.Errorf("--until %s has passed: give a time to come, or a duration (30m)", v)
		}
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(d), nil
	}
	return time.Time{}, fmt.Errorf("--until %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a positive duration (30m)", v)
}
