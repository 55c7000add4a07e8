package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/internal/fleet"
)

func newBenchFleetCmd(_ *globals) *cobra.Command {
	var o fleet.Options
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "Measure N host-bound worker instances against a NATS server in its own process",
		Long: `Start nats-server in a process of its own (or, with --cluster, three of them
with R3 streams and bucket), set up the streams as ` + "`steward setup`" + ` does, then run
--instances instances of the credential worker's Spec in this process through
the runtime, exactly as ` + "`steward worker`" + ` runs one (its handler only emits the
outcome). Instances share --conns connections; real hosts each have their own.

It prints the time until all are consuming, the servers' resident memory per
instance, their idle CPU over --idle, and for a burst of one event per
instance the time until all are settled with the p50 and p99 of publish to
settled. Each nats-server is this binary's own embedded server (the version
Steward's module requires), run in a process of its own, unless --nats-server
names a binary. Compare figures within one machine: a shared machine's
figures drift.

With --sites N it measures a fleet across sites (docs/design.md §9): a hub
(JetStream domain hub) and N leaf nodes, each a site in a domain of its own
configured as ` + "`steward site config`" + ` writes it and set up as ` + "`steward site setup`" + `
does, linked to the hub through a proxy the bench controls. --instances
credential instances are split over the sites, each on its site's leaf node in
the site's domain, and as many again run straight at the hub; all read the
stream, and each verifies the signed rotations it ranks and applies. It prints
publish-to-settled p50 and p99 of one burst through a leaf node against straight
at the hub, then cuts site-1's link, publishes --queued rotations for its hives
at the hub, heals the link, and prints the time until every one is settled at
the site, with how the hub's consumer for the site drained. The bus is open.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("bench fleet: this binary, to run its embedded nats-server: %w", err)
			}
			o.ServerCommand = []string{exe, "bench", fleetServerCmd}
			o.Progress = func(format string, args ...any) {
				fmt.Fprintf(cmd.ErrOrStderr(), "  "+format+"\n", args...)
			}
			if cmd.Flags().Changed("sites") {
				res, err := fleet.RunSites(cmd.Context(), o)
				if err != nil {
					return fmt.Errorf("bench fleet --sites: %w", err)
				}
				fmt.Fprint(cmd.OutOrStdout(), res.String())
				return nil
			}
			res, err := fleet.Run(cmd.Context(), o)
			if err != nil {
				return fmt.Errorf("bench fleet: %w", err)
			}
			fmt.Fprint(cmd.OutOrStdout(), res.String())
			return nil
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.Instances, "instances", 1000, "worker instances to run")
	fs.BoolVar(&o.Cluster, "cluster", false, "three nats-server processes in a cluster, streams and bucket at three replicas")
	fs.IntVar(&o.Conns, "conns", 0, "NATS connections the instances share (0: one per 500 instances, at least 2)")
	fs.IntVar(&o.Parallel, "parallel", 64, "instances starting at once")
	fs.DurationVar(&o.Idle, "idle", 10*time.Second, "how long the idle servers' CPU is measured")
	fs.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "give up on a phase after this long")
	fs.StringVar(&o.ServerBin, "nats-server", "", "a nats-server binary to run (empty: this binary's embedded nats-server)")
	fs.IntVar(&o.Sites, "sites", 0, "run the instances split over this many sites behind leaf nodes, and as many at the hub (at least 1)")
	fs.IntVar(&o.Queued, "queued", 10_000, "with --sites: events published for site-1 while its link is cut")
	fs.IntVar(&o.KillLeafAt, "kill-leaf-at", 0, "with --sites: SIGKILL site-1's leaf node once this many queued events are stored there during the catch-up, and start it again (0: never)")
	fs.Var(readModeFlag{&o.ReadMode}, "read-mode", "how the instances read their events: consumer (a durable consumer each) or stream (from the stream, no consumer); with --sites, always stream")
	return cmd
}

// fleetServerCmd is the hidden command bench fleet starts its servers with.
const fleetServerCmd = "fleet-server"

// newBenchFleetServerCmd runs the embedded nats-server from a config file,
// as nats-server -c does: bench fleet starts this binary again with it for
// each of its servers, so each has a process of its own.
func newBenchFleetServerCmd() *cobra.Command {
	var conf string
	cmd := &cobra.Command{
		Use:    fleetServerCmd,
		Short:  "Run the embedded nats-server from a config file (bench fleet's servers)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if conf == "" {
				return errors.New("--config (-c) is required: the nats-server config file to run")
			}
			return fleet.RunServer(cmd.Context(), conf)
		},
	}
	cmd.Flags().StringVarP(&conf, "config", "c", "", "the nats-server config file")
	return cmd
}
