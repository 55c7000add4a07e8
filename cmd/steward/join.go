package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/workers/join"
)

// The exit codes of steward join status, one per answer, so a provisioning
// script waits for armed and stops on unknown without reading the report.
const (
	joinExitArmed     = 0
	joinExitNotArmed  = 3
	joinExitUnknown   = 4
	joinExitCodesHelp = `Exit codes: 0 armed; 3 not armed (no invitation, invited, guard installed);
4 unknown (a fact needed to decide could not be read: the report says which,
fix it and ask again); 1 the command itself failed.`
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
marker. Nothing is changed.

` + joinExitCodesHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			report := join.Status(cmd.Context(), cfg)
			fmt.Fprintln(cmd.OutOrStdout(), report.String())
			if code := joinExitCode(report.Stage); code != joinExitArmed {
				return &exitCodeError{code: code, err: fmt.Errorf("box %s is %s, not armed (exit %d): the report above says why", report.Box, report.Stage, code)}
			}
			return nil
		},
	}
	cfg.AddFlags(status.Flags())
	cmd.AddCommand(status)
	return cmd
}

// joinExitCode is the exit code of a stage. Unknown is not "not armed": the
// box may be armed, and a script that waits for armed must not wait on a
// fact no one can read.
func joinExitCode(s join.Stage) int {
	switch s {
	case join.StageArmed:
		return joinExitArmed
	case join.StageUnknown:
		return joinExitUnknown
	}
	return joinExitNotArmed
}
