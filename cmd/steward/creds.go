package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newCredsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "creds",
		Short: "Issue NATS credentials scoped to one role or worker instance",
		RunE: func(cmd *cobra.Command, _ []string) error {
			return errors.New("steward creds is not built yet")
		},
	}
}
