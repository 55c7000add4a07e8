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
figures drift.`,
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
	fs.Var(readModeFlag{&o.ReadMode}, "read-mode", "how the instances read their events: consumer (a durable consumer each) or stream (from the stream, no consumer)")
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
