package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/ops"
)

// newOpsCmds are the operator's commands beside status: history, pause,
// resume, consumers and version. main.go registers them with one line
// (root.AddCommand(newOpsCmds(g)...)), so they live with their code here.
func newOpsCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{newHistoryCmd(g), newPauseCmd(g), newResumeCmd(g), newConsumersCmd(g), newVersionCmd(g)}
}

func newVersionCmd(g *globals) *cobra.Command {
	var offline bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go and nats.go versions, and the NATS server's",
		Long: `Print the module version and the commit this binary was built from, the Go
toolchain and the nats.go client it was built with, and the version of the NATS
server at --nats-url when it answers within a few seconds (--offline: do not
ask).`,
		Args: cobra.NoArgs,
	}
	out := addOutputFlags(cmd)
	cmd.Flags().BoolVar(&offline, "offline", false, "do not connect to NATS")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		v := ops.Build()
		if !offline {
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			nc, js, err := g.connect(ctx, "steward version", false)
			cancel()
			if err != nil {
				// Not an error of version: say why there is no server.
				v.Server = &ops.Server{URL: redactURL(g.natsURL), Error: err.Error()}
			} else {
				v.Server = ops.ServerOf(js)
				nc.Close()
			}
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), v)
		}
		t := newTable(cmd.OutOrStdout())
		commit := v.Commit
		if v.Modified {
			commit += " (modified)"
		}
		t.row("steward", v.Version)
		t.row("module", v.Module)
		t.row("commit", commit)
		t.row("commit time", v.CommitTime)
		t.row("go", v.Go)
		t.row("nats.go", v.NATSClient)
		switch {
		case v.Server == nil:
		case v.Server.Error != "":
			t.row("nats server", fmt.Sprintf("not reached at %s (--nats-url, STEWARD_NATS_URL): %s", v.Server.URL, v.Server.Error))
		default:
			t.row("nats server", fmt.Sprintf("%s (%s at %s)", v.Server.Version, v.Server.Name, v.Server.URL))
		}
		return t.flush()
	}
	return cmd
}
