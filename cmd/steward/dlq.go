package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/streamread"
)

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show and retry dead letters",
		Long: `Dead letters are events a worker could not apply, kept in STEWARD_DLQ with the
reason (Steward-Error), the worker (Steward-Worker), the original subject and
stream sequence, and the number of deliveries. They are kept until retried.`,
	}
	cmd.AddCommand(newDLQLsCmd(g), newDLQShowCmd(g), newDLQRetryCmd(g))
	return cmd
}

// deadLetter is one message of STEWARD_DLQ.
type deadLetter struct {
	seq     uint64 // in STEWARD_DLQ
	subject string
	header  nats.Header
	data    []byte
}

func (d deadLetter) worker() string  { return d.header.Get(events.HeaderWorker) }
func (d deadLetter) reason() string  { return d.header.Get(events.HeaderError) }
func (d deadLetter) origin() string  { return d.header.Get(events.HeaderSubject) }
func (d deadLetter) eventID() string { return headerFold(d.header, "ce-id") }

// matches says whether the dead letter belongs to worker, given as a
// consumer name (credential-h1) or a worker name (credential).
func (d deadLetter) matches(worker string) bool {
	w := d.worker()
	return worker == "" || w == worker || strings.HasPrefix(w, worker+"-")
}

// headerFold reads a header by name, ignoring case, since a publisher that
// is not Steward may write Ce-Id or CE-ID.
func headerFold(h nats.Header, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// readDLQ returns the dead letters of worker ("" for all), in order.
func readDLQ(ctx context.Context, js jetstream.JetStream, worker string) ([]deadLetter, error) {
	var out []deadLetter
	err := streamread.Each(ctx, js, streamread.Range{Stream: events.StreamDLQ}, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return err
		}
		d := deadLetter{seq: meta.Sequence.Stream, subject: m.Subject(), header: m.Headers(), data: m.Data()}
		if d.matches(worker) {
			out = append(out, d)
		}
		return nil
	})
	return out, err
}

func getDeadLetter(ctx context.Context, js jetstream.JetStream, seq uint64) (deadLetter, jetstream.Stream, error) {
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err != nil {
		return deadLetter{}, nil, fmt.Errorf("stream %s: %w", events.StreamDLQ, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return deadLetter{}, nil, fmt.Errorf("no dead letter at %s sequence %d (it may have been retried already; see steward dlq ls)", events.StreamDLQ, seq)
	}
	if err != nil {
		return deadLetter{}, nil, fmt.Errorf("dead letter %d: %w", seq, err)
	}
	return deadLetter{seq: m.Sequence, subject: m.Subject, header: m.Header, data: m.Data}, s, nil
}

func newDLQLsCmd(g *globals) *cobra.Command {
	var worker string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters: sequence, worker, subject, deliveries, reason",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			list, err := readDLQ(cmd.Context(), js, worker)
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SEQ\tWORKER\tSUBJECT\tDELIVERIES\tREASON")
			for _, d := range list {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", d.seq, d.worker(), d.origin(), d.header.Get(events.HeaderDelivered), d.reason())
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d dead letters\n", len(list))
			return nil
		},
	}
	cmd.Flags().StringVar(&worker, "worker", "", "only this worker: a name (credential) or a consumer (credential-h1)")
	return cmd
}

func newDLQShowCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "show <seq>",
		Short: "Show one dead letter: its headers and data",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			seq, err := strconv.ParseUint(args[0], 10, 64)
			if err != nil || seq == 0 {
				return fmt.Errorf("%q is not a %s sequence (see steward dlq ls)", args[0], events.StreamDLQ)
			}
			nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			d, _, err := getDeadLetter(cmd.Context(), js, seq)
			if err != nil {
				return err
			}
			showDeadLetter(cmd.OutOrStdout(), d)
			return nil
		},
	}
}

func showDeadLetter(w io.Writer, d deadLetter) {
	fmt.Fprintf(w, "sequence: %d\nsubject: %s\nheaders:\n", d.seq, d.subject)
	names := make([]string, 0, len(d.header))
	for k := range d.header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range d.header[k] {
			fmt.Fprintf(w, "  %s: %s\n", k, v)
		}
	}
	fmt.Fprintln(w, "data:")
	var pretty bytes.Buffer
	if json.Indent(&pretty, d.data, "  ", "  ") == nil {
		fmt.Fprintf(w, "  %s\n", pretty.String())
	} else {
		fmt.Fprintf(w, "  %q\n", d.data)
	}
}

func newDLQRetryCmd(g *globals) *cobra.Command {
	var worker string
	var all bool
	cmd := &cobra.Command{
		Use:   "retry [<seq>]",
		Short: "Republish dead letters to their original subject, then remove them",
		Long: `Republish a dead letter (or, with --all, every dead letter of --worker) to the
subject it was first published on, with its original headers and data and a new
Nats-Msg-Id, and then delete it from STEWARD_DLQ. Every consumer of that subject
sees the event again as a new stream message; the handlers' idempotency keeps
that safe. Fix what the reason names first, or the event comes back.`,
		Example: `  steward dlq retry 12
  steward dlq retry --worker credential-h1 --all`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 1) == all {
				return errors.New("give one sequence, or --all with --worker")
			}
			if all && worker == "" {
				return errors.New("--all needs --worker: retrying every worker's dead letters at once is rarely meant")
			}
			ctx := cmd.Context()
			nc, js, err := g.connect(ctx, "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			var list []deadLetter
			if all {
				if list, err = readDLQ(ctx, js, worker); err != nil {
					return err
				}
			} else {
				seq, err := strconv.ParseUint(args[0], 10, 64)
				if err != nil || seq == 0 {
					return fmt.Errorf("%q is not a %s sequence (see steward dlq ls)", args[0], events.StreamDLQ)
				}
				d, _, err := getDeadLetter(ctx, js, seq)
				if err != nil {
					return err
				}
				list = append(list, d)
			}
			for _, d := range list {
				seq, err := retryDeadLetter(ctx, js, d)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "retried dlq seq=%d id=%s worker=%s subject=%s new-seq=%d\n", d.seq, d.eventID(), d.worker(), d.origin(), seq)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d dead letters retried\n", len(list))
			return nil
		},
	}
	cmd.Flags().StringVar(&worker, "worker", "", "the worker whose dead letters --all retries: a name or a consumer")
	cmd.Flags().BoolVar(&all, "all", false, "retry every dead letter of --worker")
	return cmd
}

// retryDeadLetter republishes d to its original subject and then deletes it
// from the DLQ. The new Nats-Msg-Id is derived from the dead letter's own
// sequence, so running the retry again after a crash between the two steps
// stores the event once (inside the dedupe window).
func retryDeadLetter(ctx context.Context, js jetstream.JetStream, d deadLetter) (uint64, error) {
	subject := d.origin()
	if subject == "" {
		return 0, fmt.Errorf("dead letter %d has no %s header, so its original subject is unknown; it was left in the DLQ", d.seq, events.HeaderSubject)
	}
	msg := nats.NewMsg(subject)
	for k, v := range d.header {
		// The runtime's headers are about the failure, and JetStream's
		// (the old dedupe id, expectations) would refuse or drop the copy.
		if lk := strings.ToLower(k); strings.HasPrefix(lk, "steward-") || strings.HasPrefix(lk, "nats-") {
			continue
		}
		msg.Header[k] = append([]string(nil), v...)
	}
	msg.Header.Set(nats.MsgIdHdr, "steward-dlq-retry-"+strconv.FormatUint(d.seq, 10))
	msg.Data = d.data
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithExpectStream(events.StreamEvents))
	if err != nil {
		return 0, fmt.Errorf("republish dead letter %d (event %s) to %s: %w; it was left in the DLQ", d.seq, d.eventID(), subject, err)
	}
	s, err := js.Stream(ctx, events.StreamDLQ)
	if err == nil {
		err = s.DeleteMsg(ctx, d.seq)
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return ack.Sequence, fmt.Errorf("dead letter %d was republished at %s sequence %d but could not be deleted from the DLQ: %w; delete it or retry it again (the retry deduplicates for a while)", d.seq, events.StreamEvents, ack.Sequence, err)
	}
	return ack.Sequence, nil
}
