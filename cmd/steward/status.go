package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
)

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the streams, every consumer's backlog and the DLQ depth per worker",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, js, err := g.connect(cmd.Context(), "steward status", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			return printStatus(cmd.Context(), js, cmd.OutOrStdout())
		},
	}
}

func printStatus(ctx context.Context, js jetstream.JetStream, out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tMESSAGES\tBYTES\tFIRST SEQ\tLAST SEQ\tCONSUMERS")
	var streams []jetstream.Stream
	for _, name := range []string{events.StreamEvents, events.StreamOutcomes, events.StreamDLQ} {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tmissing (any worker, steward serve or steward dev creates it)\n", name)
			continue
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		st := s.CachedInfo().State
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", name, st.Msgs, st.Bytes, st.FirstSeq, st.LastSeq, st.Consumers)
		streams = append(streams, s)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "CONSUMER\tSTREAM\tPENDING\tACK PENDING\tREDELIVERED\tLAST DELIVERED")
	for _, s := range streams {
		lister := s.ListConsumers(ctx)
		var infos []*jetstream.ConsumerInfo
		for info := range lister.Info() {
			// Ordered consumers of export and dlq ls come and go; only
			// durable ones are a worker's.
			if info.Config.Durable != "" {
				infos = append(infos, info)
			}
		}
		if err := lister.Err(); err != nil {
			return fmt.Errorf("consumers of %s: %w", s.CachedInfo().Config.Name, err)
		}
		slices.SortFunc(infos, func(a, b *jetstream.ConsumerInfo) int { return strings.Compare(a.Name, b.Name) })
		for _, info := range infos {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", info.Name, info.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered, info.Delivered.Stream)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "DLQ WORKER\tDEAD LETTERS")
	dlq, err := js.Stream(ctx, events.StreamDLQ)
	if err == nil {
		info, err := dlq.Info(ctx, jetstream.WithSubjectFilter(events.DLQPrefix+".>"))
		if err != nil {
			return fmt.Errorf("stream %s: %w", events.StreamDLQ, err)
		}
		depth := map[string]uint64{}
		for subject, n := range info.State.Subjects {
			// steward.dlq.<worker>.<instance> -> the consumer name.
			rest := strings.TrimPrefix(subject, events.DLQPrefix+".")
			name, instance, _ := strings.Cut(rest, ".")
			depth[name+"-"+instance] += n
		}
		names := make([]string, 0, len(depth))
		for n := range depth {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			fmt.Fprintf(tw, "%s\t%d\n", n, depth[n])
		}
		if len(names) == 0 {
			fmt.Fprintln(tw, "(none)\t0")
		}
	}
	return tw.Flush()
}
