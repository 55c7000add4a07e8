package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/workers/join"
)

func newJoinCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Inspect this box's join state",
	}
	var cfg join.Config
	status := &cobra.Command{
		Use:   "status",
		Short: "Report what the join worker sees on this box: identity, invitation, floor, armed marker",
		Long: `Report, with the join worker's own flags, what it would find on this box: the
identity record and instance, the policy and enrollment files, the armed
marker. Nothing is changed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			report := join.Status(cmd.Context(), cfg)
			fmt.Fprintln(cmd.OutOrStdout(), report.String())
			return nil
		},
	}
	cfg.AddFlags(status.Flags())
	cmd.AddCommand(status)
	return cmd
}
