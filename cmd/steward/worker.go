package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/resident"
	"github.com/steward-dev/steward/workers"
)

// runtimeFlags are the runtime's tunables, shared by every worker command.
type runtimeFlags struct {
	ackWait       time.Duration
	maxDeliver    int
	maxPanics     int
	maxBackoff    time.Duration
	concurrency   int
	shutdownGrace time.Duration
	readMode      workers.ReadMode
}

// readModeFlag is a workers.ReadMode as a flag: consumer or stream.
type readModeFlag struct{ m *workers.ReadMode }

func (f readModeFlag) String() string {
	if f.m == nil {
		return workers.ReadConsumer.String()
	}
	return f.m.String()
}

// Set reads "consumer" (or nothing, the default) or "stream".
func (f readModeFlag) Set(s string) error {
	switch s {
	case "consumer", "":
		*f.m = workers.ReadConsumer
	case "stream":
		*f.m = workers.ReadStream
	default:
		return fmt.Errorf("read mode %q: want consumer or stream", s)
	}
	return nil
}

func (readModeFlag) Type() string { return "mode" }

func (r *runtimeFlags) add(fs *pflag.FlagSet) {
	fs.DurationVar(&r.ackWait, "ack-wait", workers.DefaultAckWait, "how long NATS waits for an ack before it redelivers (handlers heartbeat, so only a crash lets it expire)")
	fs.IntVar(&r.maxDeliver, "max-deliver", workers.DefaultMaxDeliver, "deliveries an event may get without ever settling (each process that took it died first) before it goes to the DLQ; failures are retried without a redelivery and never count")
	fs.IntVar(&r.maxPanics, "max-panics", workers.DefaultMaxPanics, "handler panics on one event before it goes to the DLQ with the panic as reason")
	fs.DurationVar(&r.maxBackoff, "max-backoff", workers.DefaultMaxBackoff, "the longest wait between two attempts of a failing event (retried for as long as it fails)")
	fs.IntVar(&r.concurrency, "concurrency", workers.DefaultConcurrency, "keys handled at once")
	fs.DurationVar(&r.shutdownGrace, "shutdown-grace", workers.DefaultShutdownGrace, "how long in-flight handlers may run on after SIGTERM")
	fs.Var(readModeFlag{&r.readMode}, "read-mode", "how the instance reads its events: consumer (a durable consumer; several processes may share the instance) or stream (no consumer, one process per instance: for fleets of host-bound workers)")
}

func (r *runtimeFlags) options(g *globals, reg prometheus.Registerer) []workers.Option {
	return []workers.Option{
		workers.WithLogger(g.log),
		workers.WithReplicas(g.replicas),
		workers.WithRegisterer(reg),
		workers.WithAckWait(r.ackWait),
		workers.WithMaxDeliver(r.maxDeliver),
		workers.WithMaxPanics(r.maxPanics),
		workers.WithMaxBackoff(r.maxBackoff),
		workers.WithConcurrency(r.concurrency),
		workers.WithShutdownGrace(r.shutdownGrace),
		workers.WithReadMode(r.readMode),
	}
}

func newWorkerCmd(g *globals) *cobra.Command {
	rf := &runtimeFlags{}
	cmd := &cobra.Command{
		Use:   "worker <kind>",
		Short: "Run one worker against a NATS server until SIGTERM",
		Long: `Run one worker against the NATS server of --nats-url until SIGTERM or SIGINT.
Processes started with the same worker and instance share its durable consumer.
On SIGTERM it stops pulling, lets running handlers finish within --shutdown-grace
and hands back what it had not started.`,
	}
	rf.add(cmd.PersistentFlags())
	for _, k := range kinds {
		sub := &cobra.Command{
			Use:   k.name,
			Short: "Run the " + k.name + " worker",
			Args:  cobra.NoArgs,
		}
		build := k.bind(sub.Flags())
		sub.RunE = func(cmd *cobra.Command, _ []string) error {
			h, err := build()
			if err != nil {
				return fmt.Errorf("%s worker: %w", k.name, err)
			}
			defer h.Close()
			return runWorker(cmd.Context(), g, rf, k.name, h)
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

// runWorker runs h under the runtime until ctx ends, with metrics and
// health on --http-addr.
func runWorker(ctx context.Context, g *globals, rf *runtimeFlags, name string, h service) error {
	nc, js, err := g.connect(ctx, "steward worker "+name, true)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry()
	spec := h.Spec()
	signer, verifier, err := g.documentKeys(spec.Name + "-" + spec.Instance)
	if err != nil {
		return fmt.Errorf("%s worker: %w", name, err)
	}
	opts := append(rf.options(g, reg), workers.WithDocumentKeys(signer, verifier), workers.WithDomain(g.jsDomain))
	var w *workers.Runtime
	err = g.retry(ctx, name+" worker: streams or consumer not ready yet", func() error {
		w, err = workers.New(js, spec, h, opts...)
		if errors.Is(err, workers.ErrInvalidSpec) {
			return backoff.Permanent(err)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s worker: %w", name, err)
	}
	if g.httpAddr != "" {
		bound, stop, err := serveHTTP(ctx, g.log, g.httpAddr, ops.NewServeMux(reg, w.Ready))
		if err != nil {
			return fmt.Errorf("--http-addr: %w", err)
		}
		defer stop()
		g.log.Info().Str("addr", bound).Msg("serving /metrics, /healthz and /readyz")
	}
	// What the packages' set-up and the worker's own left (garbage, and
	// the binary's pages only init ran) an idle worker would keep
	// resident: hand it back before running.
	if err := resident.Trim(); err != nil {
		g.log.Debug().Err(err).Msg("start-up pages left resident")
	}
	if err := w.Run(ctx); err != nil {
		return err
	}
	// Naks sent at shutdown reach the server before the connection closes,
	// so what was handed back is redelivered at once.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		g.log.Warn().Err(err).Msg("NATS flush at shutdown")
	}
	return nil
}
