package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/steward-dev/steward/events"
	"github.com/steward-dev/steward/internal/ops"
)

// steward dlq is a thin command line over internal/ops's dead-letter
// lifecycle (ops.ListLetters, RetryLetters, RemoveLetters, PurgeLetters):
// the console calls the same functions, so both select, act and audit the
// same way.

func newDLQCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, retry and remove dead letters",
		Long: `Dead letters are events a worker could not apply, kept in STEWARD_DLQ with the
reason (Steward-Error), the worker (Steward-Worker), the original's stream,
sequence, subject and digest, and the number of deliveries. They are kept until
an operator retries or removes them (or for 90 days).

ls, retry, rm and purge take the same filter: --worker, --type, --key, --reason and a
time range (--since, --until) on when the letter was stored. Every retry, rm
and purge logs one audit line per letter (action, result, DLQ sequence, event
id, worker) and stores an audit event dev.steward.dlq.<result>.v1 on
steward.outcomes.dlq.<worker>.<instance>.

Everything printed is taken from the bus, so control characters in it are
shown escaped (\x1b, \u202e), never sent to the terminal, and secrets in data
and headers are elided.`,
	}
	out := addOutputFlags(cmd)
	cmd.AddCommand(newDLQLsCmd(g, out), newDLQShowCmd(g, out), newDLQRetryCmd(g, out), newDLQRmCmd(g, out), newDLQPurgeCmd(g, out))
	return cmd
}

// dlqFilterFlags are the filter flags of ls, retry and rm, parsed into an
// ops.LetterFilter.
type dlqFilterFlags struct {
	worker, typ, key, reason, since, until string
}

func (f *dlqFilterFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.worker, "worker", "", "only this worker: a name (credential) or a consumer (credential-h1)")
	fs.StringVar(&f.typ, "type", "", "only events of this type: dev.steward.credential.rotated.v1, or credential.rotated")
	fs.StringVar(&f.key, "key", "", "only events of this key")
	fs.StringVar(&f.reason, "reason", "", "only letters whose reason holds this text (any case)")
	fs.StringVar(&f.since, "since", "", "only letters stored at or after this time: RFC 3339 or a duration back from now (24h)")
	fs.StringVar(&f.until, "until", "", "only letters stored before this time: RFC 3339 or a duration back from now (1h)")
}

// describe names the filter flags given, as they were given, so a list
// that comes back empty says what it was narrowed by.
func (f *dlqFilterFlags) describe() string {
	var parts []string
	for _, p := range []struct{ flag, v string }{
		{"worker", f.worker}, {"type", f.typ}, {"key", f.key}, {"reason", f.reason}, {"since", f.since}, {"until", f.until},
	} {
		if p.v != "" {
			parts = append(parts, "--"+p.flag+" "+strconv.Quote(p.v))
		}
	}
	if parts == nil {
		return "none"
	}
	return strings.Join(parts, " ")
}

func (f *dlqFilterFlags) filter(now time.Time) (ops.LetterFilter, error) {
	lf := ops.LetterFilter{Worker: f.worker, Key: f.key, Reason: f.reason}
	if f.typ != "" {
		typ := f.typ
		if !strings.HasPrefix(typ, "dev.steward.") {
			typ = "dev.steward." + typ + ".v1"
		}
		if _, ok := events.Lookup(typ); !ok {
			var known []string
			for _, k := range events.Kinds() {
				known = append(known, k.Type)
			}
			return lf, fmt.Errorf("--type %q is not a Steward event type: want one of %s", f.typ, strings.Join(known, ", "))
		}
		lf.Type = typ
	}
	var err error
	if lf.Since, err = parseWhen("since", f.since, now); err != nil {
		return lf, err
	}
	if lf.Until, err = parseWhen("until", f.until, now); err != nil {
		return lf, err
	}
	return lf, nil
}

// parseWhen reads a time flag: RFC 3339, or a positive duration back from
// now. "" is no bound.
func parseWhen(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("--%s %q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a positive duration back from now (24h)", flag, v)
}

func parseDLQSeqs(args []string) ([]uint64, error) {
	var out []uint64
	for _, arg := range args {
		seq, err := strconv.ParseUint(arg, 10, 64)
		if err != nil || seq == 0 {
			return nil, fmt.Errorf("%s is not a %s sequence (see steward dlq ls)", strconv.Quote(arg), events.StreamDLQ)
		}
		out = append(out, seq)
	}
	return out, nil
}

// selectLetters connects and lists what seqs or the filter select.
func selectLetters(cmd *cobra.Command, g *globals, f ops.LetterFilter) (*ops.LetterList, jetstream.JetStream, func(), error) {
	nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
	if err != nil {
		return nil, nil, nil, err
	}
	p, err := g.proofs(cmd.Context(), js)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	list, err := ops.ListLetters(cmd.Context(), js, f, p)
	if err != nil {
		nc.Close()
		return nil, nil, nil, withServerHint(g, err)
	}
	return list, js, nc.Close, nil
}

func newDLQLsCmd(g *globals, out *outputFlags) *cobra.Command {
	var (
		ff     dlqFilterFlags
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters: sequence, worker, subject, deliveries, time stored, type, key, event id, reason",
		Long: `List dead letters: sequence, worker, subject, deliveries, time stored, type, key, event id, reason.

With --follow, the letters stored afterwards that the filters select are
printed as they are stored, until interrupted (Ctrl-C); with --json, one
JSON object a line.`,
		Example: `  steward dlq ls --worker credential --since 24h
  steward dlq ls --type credential.rotated --reason "read-only" --json
  steward dlq ls --worker provision --follow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := out.asJSON()
			if err != nil {
				return err
			}
			f, err := ff.filter(time.Now())
			if err != nil {
				return err
			}
			list, js, done, err := selectLetters(cmd, g, f)
			if err != nil {
				return err
			}
			defer done()
			if follow {
				return followLetters(cmd, js, list, asJSON, ff.describe())
			}
			if asJSON {
				return printSafeJSON(cmd.OutOrStdout(), list)
			}
			if len(list.Letters) == 0 {
				// A bare header reads as a broken command; say
				// what was asked, so a filter too narrow is seen.
				t := newTable(cmd.OutOrStdout())
				t.line("no dead letters (filters: %s)", ff.describe())
				return t.flush()
			}
			if err := listLetters(cmd.OutOrStdout(), list.Letters); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%d dead letters\n", len(list.Letters))
			return nil
		},
	}
	ff.register(cmd.Flags())
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "then print each dead letter stored afterwards as it is stored, until interrupted")
	return cmd
}

// followLetters prints list, then every letter its filter selects stored
// afterwards, until the command's context ends (Ctrl-C), which is how a
// follow ends, not an error. With JSON each letter is one line, so a
// script reads them as they come.
func followLetters(cmd *cobra.Command, js jetstream.JetStream, list *ops.LetterList, asJSON bool, filters string) error {
	w := cmd.OutOrStdout()
	show := func(l ops.Letter) error {
		if asJSON {
			line, err := json.Marshal(l)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(w, jsonSafe(string(line)))
			return err
		}
		return listLetterRows(w, []ops.Letter{l}, false)
	}
	if asJSON {
		for _, l := range list.Letters {
			if err := show(l); err != nil {
				return err
			}
		}
	} else {
		if err := listLetterRows(w, list.Letters, true); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "following dead letters (filters: %s); Ctrl-C stops\n", filters)
	}
	if err := ops.FollowLetters(cmd.Context(), js, list, show); err != nil {
		return fmt.Errorf("follow dead letters: %w; what was printed stands, run the command again to go on", err)
	}
	return nil
}

// listLetters prints one row per letter; table escapes every cell. WORKER
// and INSTANCE are the worker and instance as --json names them, so the
// table and the JSON never disagree about which worker a letter is of.
func listLetters(w io.Writer, list []ops.Letter) error { return listLetterRows(w, list, true) }

// listLetterRows is listLetters, with or without the header (a followed
// letter is one more row under the header already printed).
func listLetterRows(w io.Writer, list []ops.Letter, header bool) error {
	var t *table
	if header {
		t = newTable(w, "SEQ", "WORKER", "INSTANCE", "SUBJECT", "DELIVERIES", "STORED", "TYPE", "KEY", "EVENT", "REASON")
	} else {
		t = newTable(w)
	}
	forged := 0
	for _, l := range list {
		if l.Forged != "" {
			forged++
		}
		t.row(l.Sequence, letterWorkerName(l), l.Instance, l.Original.Subject, l.Deliveries, l.Time, shortType(l.Type), l.Key, l.EventID, proofNote(l.Forged, l.Unverified, l.Reason))
	}
	if forged > 0 {
		t.line("")
		t.line("%d %s", forged, ops.ForgedNote)
	}
	return t.flush()
}

// letterWorker is the consumer a letter's DLQ subject names, and what its
// Steward-Worker header says when the two disagree.
func letterWorker(l ops.Letter) string {
	w := l.WorkerName + "-" + l.Instance
	if l.WorkerName == "" {
		w = l.Consumer
	}
	if l.WorkerMismatch {
		w += " (says " + strconv.Quote(l.Consumer) + ")"
	}
	return w
}

// letterWorkerName is the worker a letter's DLQ subject names, and what
// its Steward-Worker header says when the two disagree.
func letterWorkerName(l ops.Letter) string {
	w := l.WorkerName
	if w == "" {
		w = l.Consumer
	}
	if l.WorkerMismatch {
		w += " (says " + strconv.Quote(l.Consumer) + ")"
	}
	return w
}

// shortType is a Steward type without dev.steward. and .v1.
func shortType(t string) string {
	if s, ok := strings.CutPrefix(t, "dev.steward."); ok {
		return strings.TrimSuffix(s, ".v1")
	}
	return t
}

func newDLQShowCmd(g *globals, out *outputFlags) *cobra.Command {
	return &cobra.Command{
		Use:     "show <seq>",
		Short:   "Show one dead letter: what it is, its headers and data (secrets elided)",
		Example: "  steward dlq show 12\n  steward dlq show 12 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			asJSON, err := out.asJSON()
			if err != nil {
				return err
			}
			seqs, err := parseDLQSeqs(args)
			if err != nil {
				return err
			}
			nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
			if err != nil {
				return err
			}
			defer nc.Close()
			p, err := g.proofs(cmd.Context(), js)
			if err != nil {
				return err
			}
			l, err := ops.GetLetter(cmd.Context(), js, seqs[0], p)
			if err != nil {
				return withServerHint(g, err)
			}
			d := ops.Detail(l)
			if asJSON {
				return printSafeJSON(cmd.OutOrStdout(), d)
			}
			showLetter(cmd.OutOrStdout(), d)
			return nil
		},
	}
}

func showLetter(w io.Writer, d ops.LetterDetail) {
	p := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%s: %s\n", name, ops.Printable(fmt.Sprintf(format, args...)))
	}
	p("sequence", "%d", d.Sequence)
	p("stored", "%s", d.Time.Format(time.RFC3339Nano))
	p("subject", "%s", d.Subject)
	p("worker", "%s", letterWorker(d.Letter))
	p("event", "%s", cell(d.EventID))
	p("type", "%s", cell(d.Type))
	p("key", "%s", cell(d.Key))
	if d.EventTime != nil {
		p("event time", "%s", d.EventTime.Format(time.RFC3339Nano))
	}
	p("reason", "%s", d.Reason)
	p("deliveries", "%d", d.Deliveries)
	p("original", "%s sequence %d on %s", d.Original.Stream, d.Original.Sequence, cell(d.Original.Subject))
	p("check", "%s", d.Check)
	switch {
	case d.Forged != "":
		p("proof", "FORGED: %s (a retry refuses it)", d.Forged)
	case d.Unverified:
		p("proof", "unverified (no document keys to check it with, or stored unsigned before the upgrade record)")
	default:
		p("proof", "verified as %s", d.WorkerName+"-"+d.Instance)
	}
	if d.Truncated {
		p("truncated", "the letter holds %d of the original's %d bytes; a retry reads the original by reference", len(d.Raw.Data), d.OriginalSize)
	}
	fmt.Fprintln(w, "headers:")
	for _, h := range d.Headers {
		fmt.Fprintf(w, "  %s: %s\n", ops.Printable(h.Name), ops.Printable(h.Value))
	}
	fmt.Fprintln(w, "data:")
	// Valid JSON may still carry raw C1 controls and bidi overrides inside
	// its strings: escape each line.
	for _, line := range strings.Split(d.Data, "\n") {
		fmt.Fprintf(w, "  %s\n", ops.Printable(line))
	}
}

// printSafeJSON is printJSON with what a terminal would act on escaped:
// encoding/json escapes C0 controls but writes DEL, C1 controls and bidi
// overrides as they are, so those are written as \u escapes, which any
// JSON reader decodes to the same text.
func printSafeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	if err := printJSON(&buf, v); err != nil {
		return err
	}
	_, err := io.WriteString(w, jsonSafe(buf.String()))
	return err
}

func jsonSafe(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r >= 0x7f && ops.Unprintable(r) }) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < 0x7f || !ops.Unprintable(r):
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	return b.String()
}

// actFlags are what retry and rm take besides the filter.
type actFlags struct {
	dlqFilterFlags
	dryRun        bool
	noAuditEvents bool
	// yes confirms a retry of every letter of every worker.
	yes bool
}

func (a *actFlags) register(fs *pflag.FlagSet) {
	a.dlqFilterFlags.register(fs)
	fs.BoolVar(&a.dryRun, "dry-run", false, "list what would be acted on, and do nothing")
	fs.BoolVar(&a.noAuditEvents, "no-audit-events", false, "log the audit lines but store no audit events on steward.outcomes.dlq.>")
}

// selection reads what retry or rm act on: the sequences given, or what
// the filter matches (all of them only with all).
func (a *actFlags) selection(cmd *cobra.Command, args []string, all bool, verb string) (ops.LetterFilter, error) {
	f, err := a.filter(time.Now())
	if err != nil {
		return f, err
	}
	switch {
	case len(args) > 0 && (!f.Empty() || all):
		return f, fmt.Errorf("give sequences or a filter, not both: %s %s, or %s --worker …", verb, strings.Join(args, " "), verb)
	case len(args) > 0:
		f.Seqs, err = parseDLQSeqs(args)
		return f, err
	case all && f.Empty() && !a.yes && !a.dryRun:
		// A dry run changes nothing, so it needs no confirmation: it
		// is how an operator sees what --all --yes would do.
		return f, errors.New("--all without a filter retries every worker's dead letters at once, which is rarely meant: narrow it with --worker (or another filter), or confirm with --all --yes")
	case f.Empty() && !all:
		if verb == "rm" {
			return f, errors.New("give sequences or a filter (--worker, --type, --key, --reason, --since, --until); to remove every dead letter, run steward dlq purge --yes")
		}
		return f, fmt.Errorf("give sequences, a filter (--worker, --type, --key, --reason, --since, --until), or --all for every dead letter")
	}
	return f, nil
}

func (a *actFlags) options(g *globals) ops.ActOptions {
	return ops.ActOptions{Log: g.log.With().Str("component", "dlq").Logger(), Actor: "steward dlq", NoAuditEvents: a.noAuditEvents}
}

func newDLQRetryCmd(g *globals, out *outputFlags) *cobra.Command {
	var (
		a    actFlags
		all  bool
		rate float64
	)
	cmd := &cobra.Command{
		Use:   "retry [<seq>...]",
		Short: "Republish dead letters to the subject their event belongs on, then remove them",
		Long: `Republish dead letters (the sequences given, what a filter matches, or --all)
and remove each from STEWARD_DLQ once its event is stored. The event is decoded
from the letter (or, for a letter kept by reference, read from STEWARD_EVENTS
and checked against the letter's digest), validated again, and published to the
subject its type and key map to, never to a subject the letter names. A letter
whose worker and DLQ subject disagree, that was altered, or whose event is still
invalid is refused and kept. When JetStream reports the republish as a
duplicate of something other than this event, nothing was stored, so the letter
is kept.

Letters are republished in the order their originals were stored, at most
--rate a second. A refused letter holds back the later letters of its key
(reported as held, and kept), so no key's events are republished out of order.

Every consumer of that subject sees the event again as a new stream message;
the handlers' idempotency keeps that safe. Fix what the reason names first, or
the event comes back.`,
		Example: `  steward dlq retry 12
  steward dlq retry --worker credential-h1 --reason "read-only" --rate 5
  steward dlq retry --all --worker credential --dry-run
  steward dlq retry --all --yes`,
	}
	a.register(cmd.Flags())
	cmd.Flags().BoolVar(&all, "all", false, "retry every dead letter the filter matches (with no filter, every worker's: add --yes)")
	cmd.Flags().BoolVar(&a.yes, "yes", false, "with --all and no filter: yes, every worker's dead letters")
	cmd.Flags().Float64Var(&rate, "rate", ops.DefaultRetryRate, "republish at most this many letters a second")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		if rate <= 0 {
			return fmt.Errorf("--rate %g: give a positive number of letters a second (a bulk retry at an unbounded rate floods the workers)", rate)
		}
		ctx := cmd.Context()
		nc, js, list, err := a.selected(cmd, g, args, all, "retry")
		if err != nil {
			return err
		}
		defer nc.Close()
		if a.dryRun {
			return dryRun(cmd, asJSON, "retry", ops.RetryOrder(list.Letters))
		}
		o := ops.RetryOptions{ActOptions: a.options(g), Rate: rate}
		p := startProgress(cmd.ErrOrStderr(), cmd.OutOrStdout(), "retried")
		p.setTotal(uint64(len(list.Letters)))
		o.OnResult = func(ops.Result) { p.add(1) }
		rep, runErr := ops.RetryLetters(ctx, js, list.Letters, o)
		p.finish()
		if err := report(cmd, asJSON, rep); err != nil {
			return err
		}
		return errors.Join(runErr, rep.Err())
	}
	return cmd
}

// missingSeqs says which sequences given hold no letter, so `retry 12`
// of a letter retried already is an error, not a quiet nothing.
// selected connects and lists the letters a retry or rm names, checking
// that every sequence asked for is there. The caller closes nc.
func (a *actFlags) selected(cmd *cobra.Command, g *globals, args []string, all bool, verb string) (*nats.Conn, jetstream.JetStream, *ops.LetterList, error) {
	f, err := a.selection(cmd, args, all, verb)
	if err != nil {
		return nil, nil, nil, err
	}
	nc, js, err := g.connect(cmd.Context(), "steward dlq", false)
	if err != nil {
		return nil, nil, nil, err
	}
	// A retry refuses the letters listed as forged, so the listing checks
	// proofs as `dlq ls` does.
	p, err := g.proofs(cmd.Context(), js)
	var list *ops.LetterList
	if err == nil {
		list, err = ops.ListLetters(cmd.Context(), js, f, p)
		if err == nil {
			err = missingSeqs(f, list)
		} else {
			err = withServerHint(g, err)
		}
	}
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	return nc, js, list, nil
}

func missingSeqs(f ops.LetterFilter, list *ops.LetterList) error {
	if f.Seqs == nil {
		return nil
	}
	found := map[uint64]bool{}
	for _, l := range list.Letters {
		found[l.Sequence] = true
	}
	var missing []string
	for _, s := range f.Seqs {
		if !found[s] {
			missing = append(missing, strconv.FormatUint(s, 10))
		}
	}
	if missing != nil {
		return fmt.Errorf("no dead letter at %s sequence %s (retried or removed already?); nothing was done: list what is there with steward dlq ls", events.StreamDLQ, strings.Join(missing, ", "))
	}
	return nil
}

func dryRun(cmd *cobra.Command, asJSON bool, verb string, list []ops.Letter) error {
	if asJSON {
		return printSafeJSON(cmd.OutOrStdout(), ops.LetterList{Letters: list})
	}
	if err := listLetters(cmd.OutOrStdout(), list); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "dry run: %s would act on these %d dead letters, in this order; nothing was done\n", verb, len(list))
	return nil
}

// report prints what an action did: one line per letter on stdout for
// what was done, on stderr for what was kept, then the counts.
func report(cmd *cobra.Command, asJSON bool, rep *ops.Report) error {
	if rep == nil {
		return nil
	}
	if asJSON {
		return printSafeJSON(cmd.OutOrStdout(), rep)
	}
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	for _, r := range rep.Results {
		worker := ops.Printable(r.Worker + "-" + r.Instance)
		id := ops.Printable(cell(r.EventID))
		switch {
		case r.Result == ops.ResultRetried:
			note := ""
			if r.Already {
				note = " (stored by an earlier retry; the letter is now removed)"
			}
			fmt.Fprintf(stdout, "retried dlq seq=%d id=%s worker=%s subject=%s new-seq=%d%s\n", r.Sequence, id, worker, r.Subject, r.NewSequence, note)
		case r.OK():
			fmt.Fprintf(stdout, "%s dlq seq=%d id=%s worker=%s key=%s\n", r.Result, r.Sequence, id, worker, ops.Printable(cell(r.Key)))
		default:
			fmt.Fprintf(stderr, "%s: dlq seq=%d id=%s worker=%s: %s\n", r.Result, r.Sequence, id, worker, ops.Printable(r.Error))
		}
		if r.AuditError != "" {
			fmt.Fprintf(stderr, "warning: dlq seq=%d: %s\n", r.Sequence, ops.Printable(r.AuditError))
		}
	}
	fmt.Fprintf(stderr, "%d dead letters %s, %d refused, %d held, %d gone\n", rep.Done, pastTense(rep.Action), rep.Refused, rep.Held, rep.Gone)
	return nil
}

func pastTense(action string) string {
	switch action {
	case ops.ActionRetry:
		return "retried"
	case ops.ActionRemove:
		return "removed"
	}
	return "purged"
}

func newDLQRmCmd(g *globals, out *outputFlags) *cobra.Command {
	var a actFlags
	cmd := &cobra.Command{
		Use:   "rm [<seq>...]",
		Short: "Remove dead letters without republishing their events",
		Long: `Delete dead letters from STEWARD_DLQ: the sequences given, or exactly the
letters a filter matches when the command reads them (a letter stored later is
never hit: a stream never reuses a sequence). Their events are not republished;
use it for letters you have dealt with another way (a corrected event
published, a forged letter). Try the filter with steward dlq ls, or --dry-run,
first.`,
		Example: `  steward dlq rm 12 13
  steward dlq rm --worker credential-h1 --reason "unknown field" --dry-run`,
	}
	a.register(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		nc, js, list, err := a.selected(cmd, g, args, false, "rm")
		if err != nil {
			return err
		}
		defer nc.Close()
		if a.dryRun {
			return dryRun(cmd, asJSON, "rm", list.Letters)
		}
		rep, runErr := ops.RemoveLetters(ctx, js, list.Letters, a.options(g))
		if err := report(cmd, asJSON, rep); err != nil {
			return err
		}
		if rep != nil {
			runErr = errors.Join(runErr, rep.Err())
		}
		return runErr
	}
	return cmd
}

func newDLQPurgeCmd(g *globals, out *outputFlags) *cobra.Command {
	var (
		ff            dlqFilterFlags
		yes           bool
		noAuditEvents bool
	)
	cmd := &cobra.Command{
		Use:   "purge --yes",
		Short: "Remove every dead letter without republishing any",
		Long: `Delete every dead letter STEWARD_DLQ holds when the command reads it; a letter
a worker writes meanwhile is kept. No event is republished. Each letter gets
its audit line and audit event, as with rm. With a filter (--worker, --type,
--key, --reason, --since, --until), only the letters it matches are deleted,
one by one as rm deletes them, and audited as removed.`,
		Example: "  steward dlq purge --yes\n  steward dlq purge --worker converge --yes",
		Args:    cobra.NoArgs,
	}
	ff.register(cmd.Flags())
	cmd.Flags().BoolVar(&yes, "yes", false, "really remove every dead letter (the filter matches)")
	cmd.Flags().BoolVar(&noAuditEvents, "no-audit-events", false, "log the audit lines but store no audit events on steward.outcomes.dlq.>")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		asJSON, err := out.asJSON()
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		f, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		nc, js, err := g.connect(ctx, "steward dlq", false)
		if err != nil {
			return err
		}
		defer nc.Close()
		o := ops.ActOptions{Log: g.log.With().Str("component", "dlq").Logger(), Actor: "steward dlq", NoAuditEvents: noAuditEvents}
		if !f.Empty() {
			// A stream purge can only narrow by subject, and the
			// filter also reads type, key, reason and time: the
			// letters it matches are removed one by one.
			list, err := ops.ListLetters(ctx, js, f, ops.Proofs{})
			if err != nil {
				return withServerHint(g, err)
			}
			if !yes {
				return fmt.Errorf("purge would remove the %d dead letters the filter (%s) matches without republishing any: look at them with steward dlq ls and the same filter, then add --yes", len(list.Letters), ff.describe())
			}
			rep, err := ops.RemoveLetters(ctx, js, list.Letters, o)
			if err != nil && rep == nil {
				return withServerHint(g, err)
			}
			if perr := report(cmd, asJSON, rep); perr != nil {
				return perr
			}
			return errors.Join(err, rep.Err())
		}
		if !yes {
			// Only counted: a purge removes forged letters and others alike.
			list, err := ops.ListLetters(ctx, js, ops.LetterFilter{}, ops.Proofs{})
			if err != nil {
				return withServerHint(g, err)
			}
			return fmt.Errorf("purge removes all %d dead letters in %s without republishing any: look at them with steward dlq ls, then run steward dlq purge --yes", len(list.Letters), events.StreamDLQ)
		}
		rep, err := ops.PurgeLetters(ctx, js, o)
		if err != nil {
			return withServerHint(g, err)
		}
		return report(cmd, asJSON, rep)
	}
	return cmd
}
