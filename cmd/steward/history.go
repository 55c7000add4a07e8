package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
)

func newHistoryCmd(g *globals) *cobra.Command {
	var (
		o      ops.HistoryOptions
		since  string
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "history <worker> <key>",
		Short: "Show the events of one key and the outcomes and dead letters they caused, in order",
		Long: `Print every event of the key on the worker's subjects, and every outcome and dead
letter of the worker's instances that names one of those events (their
causationid) or the key, in the order they were stored, with ids, times and
trace ids (from the traceparent extension). Outcomes a replay emitted are
marked. An outcome or dead letter whose proof does not verify as the instance
its subject names is marked FORGED with the reason: some identity made the bus
store it, and it says nothing about what the instance did. Without document
keys (no --nats-creds, --document-trust or --document-key) they are marked
unverified. Stored messages that are not events are reported and left out.

With --follow, the entries stored afterwards are printed as they are stored,
until interrupted (Ctrl-C); with --json, every entry is then one JSON object
per line: the history's entries first, then each new one.`,
		Example: `  steward history credential hive-7
  steward history provision db-1 --since 24h -o json
  steward history converge dev --follow`,
		Args: cobra.ExactArgs(2),
	}
	out := addOutputFlags(cmd)
	fs := cmd.Flags()
	fs.StringVar(&o.Instance, "instance", "", "only the outcomes and dead letters of this instance")
	fs.StringVar(&since, "since", "", "from this time on: RFC 3339 or a duration back from now (24h)")
	fs.BoolVarP(&follow, "follow", "f", false, "then print each entry stored afterwards as it is stored, until interrupted")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		o.Worker, o.Key = args[0], args[1]
		if since != "" {
			if o.Since, err = parseSince(since, time.Now()); err != nil {
				return err
			}
		}
		nc, js, err := g.connect(cmd.Context(), "steward history", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		if o.Proofs, err = g.proofs(cmd.Context(), js); err != nil {
			return err
		}
		h, err := ops.GetHistory(cmd.Context(), js, o)
		if err != nil {
			return withServerHint(g, err)
		}
		w := cmd.OutOrStdout()
		if follow {
			return followHistory(cmd, js, h, asJSON)
		}
		if asJSON {
			return printJSON(w, h)
		}
		return printHistory(w, h)
	}
	return cmd
}

// followHistory prints h, then every entry stored afterwards, until the
// command's context ends (Ctrl-C), which is how a follow ends, not an
// error. With JSON each entry is one line, so a script reads them as they
// come; a table row is flushed at once, aligned as well as one row can be.
func followHistory(cmd *cobra.Command, js jetstream.JetStream, h *ops.History, asJSON bool) error {
	w := cmd.OutOrStdout()
	show := func(e ops.Entry) error {
		if asJSON {
			line, err := json.Marshal(e)
			if err != nil {
				return err
			}
			// What a terminal would act on is escaped, as dlq's JSON is.
			_, err = fmt.Fprintln(w, jsonSafe(string(line)))
			return err
		}
		t := newTable(w)
		historyRow(t, e)
		return t.flush()
	}
	if asJSON {
		for _, e := range h.Entries {
			if err := show(e); err != nil {
				return err
			}
		}
	} else if err := printHistory(w, h); err != nil {
		return err
	}
	if !asJSON {
		fmt.Fprintf(cmd.ErrOrStderr(), "following key %s for worker %s; Ctrl-C stops\n", ops.Printable(h.Key), h.Worker)
	}
	if err := ops.FollowHistory(cmd.Context(), js, h, show); err != nil {
		return fmt.Errorf("follow key %s: %w; what was printed stands, run the command again to go on", h.Key, err)
	}
	return nil
}

func printHistory(w io.Writer, h *ops.History) error {
	t := newTable(w)
	t.line("history of key %s for worker %s on %s", h.Key, h.Worker, h.Server)
	t.line("")
	if len(h.Entries) == 0 {
		t.line("(nothing stored for this key: check the worker and the key, or --since)")
	} else {
		t.row("TIME", "WHAT", "STREAM SEQ", "ID", "TYPE", "CAUSED BY", "TRACE ID", "NOTE", "REASON")
		for _, e := range h.Entries {
			historyRow(t, e)
		}
	}
	for _, u := range h.Unreadable {
		t.line("left out: %s seq %d on %s is not an event: %s", u.Stream, u.Sequence, u.Subject, u.Error)
	}
	if h.Forged > 0 {
		t.line("")
		t.line("%d %s", h.Forged, ops.ForgedNote)
	}
	return t.flush()
}

// historyRow prints one entry as a row of the history table.
func historyRow(t *table, e ops.Entry) {
	what, note := e.Kind, ""
	switch e.Kind {
	case ops.EntryOutcome:
		what = "outcome " + e.Outcome
		note = "instance " + e.Instance
		if e.Replay {
			note += ", replayed"
		}
	case ops.EntryDeadLetter:
		note = "instance " + e.Instance
	}
	note = proofNote(e.Forged, e.Unverified, note)
	t.row(e.Time.Format(time.RFC3339Nano), what, fmt.Sprintf("%s %d", shortStream(e.Stream), e.Sequence), e.ID, e.Type, e.CausationID, e.TraceID, note, entryReason(e))
}

// entryReason is why an entry is what it is, "rule: reason" when it names
// a rule. A forged entry's reason is only what it claims, and says so, so
// no one acts on a rule some identity made the bus store.
func entryReason(e ops.Entry) string {
	r := e.Reason
	if e.Rule != "" {
		r = e.Rule + ": " + r
	}
	if e.Forged != "" && r != "" {
		r = "claimed: " + r
	}
	return r
}

// proofNote puts what a message's proof says in front of the note about
// it: a forged outcome or dead letter leads with FORGED and why, so it is
// never read as what the instance did; one that could not be checked says
// so.
func proofNote(forged string, unverified bool, note string) string {
	switch {
	case forged != "":
		return "FORGED: " + forged + "; it claims: " + note
	case unverified:
		return "unverified, " + note
	}
	return note
}

// shortStream names a stream by its last word: events, outcomes, dlq.
func shortStream(s string) string {
	switch s {
	case events.StreamEvents:
		return "events"
	case events.StreamOutcomes:
		return "outcomes"
	case events.StreamDLQ:
		return "dlq"
	}
	return s
}
