package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/ops"
)

func newConsumersCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "consumers",
		Short: "List and remove the durable consumers Steward created",
	}
	cmd.AddCommand(newConsumersLsCmd(g), newConsumersRmCmd(g))
	return cmd
}

func newConsumersLsCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List the durable consumers of Steward's streams",
		Long: `List the durable consumers Steward created on its streams (one per worker
instance), with whether a process consumes each now, its pending events, when it
was last active and whether it is paused. A consumer nobody consumes and that
no worker will come back to (an instance retired, one an older 'replay
--dry-run' made) is removed with 'steward consumers rm'. --all lists the
consumers other tools made too.`,
		Args: cobra.NoArgs,
	}
	out := addOutputFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "list the durable consumers other tools made too")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		nc, js, err := g.connect(cmd.Context(), "steward consumers ls", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		list, err := ops.Consumers(cmd.Context(), js)
		if err != nil {
			return withServerHint(g, err)
		}
		shown := []ops.Consumer{}
		for _, c := range list {
			if all || c.Steward {
				shown = append(shown, c)
			}
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), shown)
		}
		return printConsumers(cmd.OutOrStdout(), shown, time.Now())
	}
	return cmd
}

func printConsumers(w io.Writer, list []ops.Consumer, now time.Time) error {
	t := newTable(w, "STREAM", "CONSUMER", "STEWARD", "CONSUMING", "PENDING", "ACK PENDING", "LAST ACTIVE", "PAUSED UNTIL", "CREATED")
	for _, c := range list {
		active := "never"
		if c.LastActive != nil {
			active = ago(now, *c.LastActive)
		}
		t.row(c.Stream, c.Name, c.Steward, c.Consuming, c.Pending, c.AckPending, active, c.PausedUntil, c.Created)
	}
	if len(list) == 0 {
		t.line("(no durable consumers)")
	}
	return t.flush()
}

func newConsumersRmCmd(g *globals) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "rm <consumer>...",
		Short: "Remove durable consumers Steward created on STEWARD_EVENTS",
		Long: `Remove durable consumers of STEWARD_EVENTS that Steward created, by name
(<worker>-<instance>, as 'steward consumers ls' lists them). A consumer another
tool made is refused. So is one a process consumes now, unless --force: that
process would stop receiving events until it restarts. Events stay stored; a
worker started again makes its consumer again and reads from the start of the
stream, its checkpoints skipping what it had already applied.`,
		Example: `  steward consumers rm credential-hive-retired`,
		Args:    cobra.MinimumNArgs(1),
	}
	out := addOutputFlags(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "remove a consumer even while a process consumes it")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		nc, js, err := g.connect(cmd.Context(), "steward consumers rm", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		removed := []ops.Consumer{}
		var failed error
		for _, name := range args {
			c, err := ops.RemoveConsumer(cmd.Context(), js, name, force)
			if err != nil {
				failed = withServerHint(g, err)
				break
			}
			removed = append(removed, c)
			if !asJSON {
				fmt.Fprintln(cmd.OutOrStdout(), ops.Printable(fmt.Sprintf("removed consumer %s from %s (%d events were pending)", c.Name, c.Stream, c.Pending)))
			}
		}
		if asJSON {
			if err := printJSON(cmd.OutOrStdout(), removed); err != nil {
				return err
			}
		}
		return failed
	}
	return cmd
}
