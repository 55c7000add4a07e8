package main

import (
	"bytes"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/atomicfile"
	"github.com/steward-dev/steward/internal/ops"
	"github.com/steward-dev/steward/internal/streamread"
)

func newExportCmd(g *globals) *cobra.Command {
	var (
		stream, since, out string
		fromSeq            uint64
		subjects           []string
		limit              int
	)
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write a range of a stream as JSONL (one CloudEvent per line)",
		Long: `Write the events of a stream range in the CloudEvents JSON format, one per line,
to stdout or --out: the form 'steward publish --file' and workertest.PublishFile
read back. The range ends at the last message stored when the export starts.
A message that is not a CloudEvent (a malformed dead letter), or an event whose
stored data is broken, is reported on stderr with its sequence and left out;
the export goes on. Progress is reported on stderr when it takes over a second.`,
		Example: `  steward export --since 24h > yesterday.jsonl
  steward export --subject 'steward.events.credential.rotated.>' --from-seq 100 --limit 50 --out rotations.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			startTime, err := startPoint(fromSeq, since, time.Now())
			if err != nil {
				return err
			}
			r := streamread.Range{Stream: stream, Subjects: subjects, StartSeq: fromSeq, StartTime: startTime, Limit: limit}
			if limit < 0 {
				return fmt.Errorf("--limit %d: want 0 (no limit) or more", limit)
			}
			nc, js, err := g.connect(cmd.Context(), "steward export", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			var buf bytes.Buffer
			w := io.Writer(&buf)
			if out == "" {
				w = cmd.OutOrStdout()
			}
			n, skipped := 0, 0
			stderr := cmd.ErrOrStderr()
			prog := startProgress(stderr, w, "exported")
			r.Total = prog.setTotal
			var line bytes.Buffer
			err = streamread.Each(cmd.Context(), js, r, func(m jetstream.Msg) error {
				prog.add(1)
				var seq uint64
				if meta, _ := m.Metadata(); meta != nil {
					seq = meta.Sequence.Stream
				}
				e, err := events.Decode(m.Headers(), m.Data())
				if err == nil {
					// An event whose stored data is not what its content
					// type says (broken JSON) decodes but cannot be
					// written: write each line aside first, so one broken
					// event is reported and left out, never the end of the
					// export.
					line.Reset()
					if werr := events.WriteJSONL(&line, e); werr != nil {
						err = fmt.Errorf("event %s cannot be written as JSON (its data is not valid %s): %w", e.ID(), e.DataContentType(), werr)
					}
				}
				if err != nil {
					skipped++
					fmt.Fprintln(stderr, ops.Printable(fmt.Sprintf("seq %d on %s is left out: %v", seq, m.Subject(), err)))
					return nil
				}
				n++
				_, err = w.Write(line.Bytes())
				return err
			})
			prog.finish()
			if err != nil {
				return withServerHint(g, err)
			}
			if out != "" {
				// Written whole or not at all: a half export looks complete.
				if err := atomicfile.Write(out, buf.Bytes(), 0o600); err != nil {
					return fmt.Errorf("--out: %w", err)
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "exported %d events from %s (%d left out)\n", n, stream, skipped)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&stream, "stream", events.StreamEvents, "the stream to read: "+events.StreamEvents+", "+events.StreamOutcomes+" or "+events.StreamDLQ)
	fs.Uint64Var(&fromSeq, "from-seq", 0, "first stream sequence to export (default: the first kept)")
	fs.StringVar(&since, "since", "", "export from this time on: RFC 3339 (2026-01-02T15:04:05Z) or a duration back from now (24h)")
	fs.StringSliceVar(&subjects, "subject", nil, "only these subjects (wildcards allowed; repeat or comma-separate)")
	fs.IntVar(&limit, "limit", 0, "stop after this many messages (0: no limit)")
	fs.StringVar(&out, "out", "", "write to this file (atomically, mode 0600) instead of stdout")
	return cmd
}

// startPoint checks that at most one of --from-seq and --since is given and
// returns the time --since names (zero when it is not given).
func startPoint(fromSeq uint64, since string, now time.Time) (time.Time, error) {
	if since == "" {
		return time.Time{}, nil
	}
	if fromSeq != 0 {
		return time.Time{}, fmt.Errorf("--from-seq %d and --since %q both given: keep one", fromSeq, since)
	}
	return parseSince(since, now)
}

// parseSince reads a point in time: RFC 3339, or a duration back from now.
func parseSince(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--since %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a positive duration (24h)", v)
}
