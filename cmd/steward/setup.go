package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newSetupCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "setup",
		Short: "Create or update Steward's streams and checkpoint bucket with their limits (an operator's command)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("steward setup is not built yet")
		},
	}
}
