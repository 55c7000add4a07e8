package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newBenchFleetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "fleet",
		Short: "Measure N host-bound worker instances against a NATS server in its own process",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("steward bench fleet is not built yet")
		},
	}
}
